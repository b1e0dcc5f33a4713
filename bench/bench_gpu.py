"""GPU benchmark: DCGAN-64, batch 64, one full D+G iteration, on one GPU (NCCL, world size 1).

In one run, each in its own process:
- eager DDP, mmengine style: one DistributedDataParallel per submodule
  (find_unused_parameters=True), frozen submodules under no_sync(), torch.optim Adam defaults;
- StyleGAN3 style: no DDP, one flat NCCL all-reduce of every non-None gradient after backward;
- torch.compile(mode="reduce-overhead") of each phase method (no DDP: world size 1);
- ganc: `ganc run --device cuda`, every phase captured once and replayed.

Prints ms per iteration, ganc's speed-up over each, the GPU busy fraction (kernel time /
wall time; for ganc the GPU time of the replays / wall time) and ganc's host time per
replayed phase.

    python3 bench/bench_gpu.py [--iters 200] [--warmup 20]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "models"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ganc  # noqa: E402
from ganc.oracle import Inputs, free_port  # noqa: E402
import zoo  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402

GANC = os.environ.get("GANC", os.path.join(ROOT, "build", "tools", "ganc"))


def _kernel_seconds(prof) -> float:
    total = 0.0
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:  # a kernel or memcpy on the GPU
            total += evt.time_range.elapsed_us() / 1e6
    return total


def _baseline(rank, port, style, data_path, iters, warmup, result_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.backends.cudnn.benchmark = True
    gan, spec = zoo.build("dcgan64")
    spec = ganc.validate(spec)
    gan = gan.cuda().train()
    data = torch.load(data_path)
    data = (data["images"] if isinstance(data, dict) else data).float()
    inputs = Inputs(spec, data, 0, 1, seed=0, device="cuda")
    subs = ["discriminator", "generator"]
    opts = {s: torch.optim.Adam(getattr(gan, s).parameters(), lr=2e-4, betas=(0.5, 0.999)) for s in subs}
    if style == "ddp":
        for s in subs:
            setattr(gan, s, DDP(getattr(gan, s), device_ids=[0], find_unused_parameters=True,
                                broadcast_buffers=False))
    methods = {p["name"]: getattr(gan, p["method"]) for p in spec["phases"]}
    if style == "compile":
        methods = {k: torch.compile(m, mode="reduce-overhead") for k, m in methods.items()}

    def iteration():
        baselines.iteration(gan, spec, subs, inputs, opts, "flat" if style == "compile" else style, 1, methods)

    for _ in range(warmup):
        iteration()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        iteration()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iters
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            iteration()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    busy = _kernel_seconds(prof) / wall
    with open(result_path, "w") as f:
        json.dump({"seconds": seconds, "busy": busy}, f)
    dist.destroy_process_group()


def baseline(style, data, iters, warmup, tmp):
    path = os.path.join(tmp, style + ".json")
    try:
        mp.spawn(_baseline, args=(free_port(), style, data, iters, warmup, path), nprocs=1, join=True)
    except Exception as e:  # torch.compile may not run everywhere: report, do not hide
        print(f"{style}: failed ({str(e).splitlines()[-1] if str(e) else type(e).__name__})")
        return None
    return json.load(open(path))


def run_ganc(data, iters, warmup, tmp):
    gan, spec = zoo.build("dcgan64")
    archive, plan = os.path.join(tmp, "dcgan64.pt"), os.path.join(tmp, "dcgan64.plan")
    ganc.export(gan, archive, spec)
    subprocess.run([GANC, "compile", archive, "-o", plan], check=True)
    out = os.path.join(tmp, "ganc")
    steps = warmup + iters
    subprocess.run([GANC, "run", "--nproc", "1", plan, "--model", archive, "--data", data, "--device", "cuda",
                    "--steps", str(steps), "--out", out, "--sample-every", "0", "--checkpoint-every", "0",
                    "--log-every", str(steps), "--warmup", "3", "--profile"], check=True, stdout=subprocess.DEVNULL)
    t = json.load(open(os.path.join(out, "timing.json")))
    steady = t["step_seconds"][warmup:]
    phases = 2
    replay_host = t["run_host_seconds"][warmup * phases:]
    return {"seconds": sum(steady) / len(steady), "median": statistics.median(steady),
            "busy": t["replay_gpu_seconds"] / sum(t["step_seconds"][3:]),
            "host_per_phase": statistics.median(replay_host)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "digits64.pt")
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), "digits", "-o", data,
                        "--size", "64"], check=True, stdout=subprocess.DEVNULL)
        g = run_ganc(data, args.iters, args.warmup, tmp)
        rows = [("eager DDP (per submodule)", baseline("ddp", data, args.iters, args.warmup, tmp)),
                ("StyleGAN3-style flat", baseline("flat", data, args.iters, args.warmup, tmp)),
                ("torch.compile reduce-overhead", baseline("compile", data, args.iters, args.warmup, tmp))]
    print(f"\nDCGAN-64, batch 64, one D+G iteration, {torch.cuda.get_device_name(0)}, NCCL world size 1")
    print(f"{'method':32} {'ms/iter':>8} {'ganc speed-up':>14} {'GPU busy':>9}")
    for name, r in rows:
        if r is None:
            print(f"{name:32} {'n/a':>8}")
            continue
        print(f"{name:32} {r['seconds'] * 1e3:8.3f} {r['seconds'] / g['seconds']:13.2f}x {r['busy'] * 100:8.1f}%")
    print(f"{'ganc (CUDA Graph replay)':32} {g['seconds'] * 1e3:8.3f} {'':>14} {g['busy'] * 100:8.1f}%")
    print(f"ganc host time per replayed phase: {g['host_per_phase'] * 1e6:.1f} us (median)")


if __name__ == "__main__":
    main()
