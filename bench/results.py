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


def gradient_parity(got_dir, ref_dir, steps, phases):
    """ganc's --dump-grads files (got_dir) against an eager reference's (ref_dir, ganc.oracle's):
    per phase the largest difference of the all-reduced gradients relative to each tensor's
    largest magnitude ({"first_step", "all_steps", "by_step"}), the phase runs whose
    parameters differ, the final parameters' largest difference and their count."""
    import torch
    import ganc

    def relative(a, b):
        return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)

    worst, mismatched = {}, []
    for step in range(steps):
        for phase in phases:
            if step % phase.get("interval", 1):
                continue
            name = f"grads_step{step}_{phase['name']}.pt"
            got = ganc.load_checkpoint(os.path.join(got_dir, name))
            ref = torch.load(os.path.join(ref_dir, name))
            if set(got) != set(ref):
                mismatched.append({"step": step, "phase": phase["name"], "ganc_only": sorted(set(got) - set(ref)),
                                   "ddp_only": sorted(set(ref) - set(got))})
            err = max(relative(got[k], ref[k]) for k in set(got) & set(ref))
            found = worst.setdefault(phase["name"], {"first_step": err, "all_steps": 0.0, "by_step": {}})
            found["all_steps"] = max(found["all_steps"], err)
            found["by_step"][step] = err
    got = ganc.load_checkpoint(os.path.join(got_dir, "params_final.pt"))
    ref = torch.load(os.path.join(ref_dir, "params_final.pt"))
    return worst, mismatched, max(relative(got[k], ref[k]) for k in ref), len(ref)
