"""What every benchmark shares: its set-up (`import results` first puts the repository's
python/ and models/ on sys.path, and gives ROOT and GANC, the built `ganc` or $GANC), running
and watching the processes it measures, and where its numbers go: bench/results/NAME.json,
with the machine, the date and the command that measured them beside every number.
docs/benchmarks.md is generated from these files (scripts/gen_docs.py)."""

import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GANC = os.environ.get("GANC", os.path.join(ROOT, "build", "tools", "ganc"))
for _path in (os.path.join(ROOT, "models"), os.path.join(ROOT, "python")):
    if _path not in sys.path:
        sys.path.insert(0, _path)


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
    """ganc's --dump-grads files (got_dir) against an eager reference's (ref_dir, ganc.reference's):
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


class MemorySampler:
    """The GPU's memory in use, sampled with nvidia-smi every 0.2 s while a side runs; the peak
    above what was in use before it started."""

    def __init__(self):
        self.base = self._used()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _used():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
            return int(out.split()[0])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return None

    def _loop(self):
        while not self._stop.wait(0.2):
            used = self._used()
            if used is not None and (self.peak is None or used > self.peak):
                self.peak = used

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def peak_gib(self):
        if self.base is None or self.peak is None:
            return None
        return (self.peak - self.base) / 1024.0


def read_jsonl(path: str) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_until(cmd: list, limit: float, log, **kwargs):
    """Runs `cmd` for at most `limit` seconds: then SIGINT (ganc and train.py both stop cleanly on
    it, ganc writing its timing.json with the phases' times), and SIGKILL 20 s later. Its exit
    status, or "timeout"."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kwargs)

    def stop(grace: float) -> None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        stop(20)
        return "timeout"
    except KeyboardInterrupt:  # this script's own deadline: the run stops with it
        stop(10)
        raise

