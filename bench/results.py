"""Where the benchmarks' numbers go: bench/results/NAME.json, with the machine, the date and
the command that measured them beside every number. docs/benchmarks.md is generated from these
files (scripts/gen_docs.py)."""

import datetime
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def machine():
    """The machine in words: the GPU's name where torch sees one, else the CPU and its cores."""
    try:
        import torch
        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores"
    except ImportError:
        pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def save(result, path):
    """Writes one result dict to `path` as JSON (its folder made as needed); a benchmark that
    writes its result after each part calls it again with what it has so far."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


def write(name, title, numbers, table=None):
    """Writes bench/results/NAME.json: `title` (what was measured, one sentence), the machine,
    date and command, `numbers` (every number, as the benchmark's own dict) and optionally
    `table` ({"columns": [...], "rows": [[...], ...]}: what docs/benchmarks.md shows)."""
    import torch
    result = {"benchmark": name, "title": title, "machine": machine(),
              "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "command": " ".join([os.path.relpath(sys.argv[0], os.path.dirname(HERE))] + sys.argv[1:]),
              "numbers": numbers}
    if table:
        result["table"] = table
    path = os.path.join(HERE, "results", name + ".json")
    save(result, path)
    print(f"results: {os.path.relpath(path)}")
    return path
