"""CPU benchmark: ganc on 2 Gloo ranks against the two ways people train GANs with PyTorch.

In one run, for the MLP GAN, DCGAN-32 and DCGAN-32 with the training-step features of GPU
recipes (dcgan32_amp: bfloat16 autocast, a GradScaler, D accumulating 2 micro-batches, G
clipped; each baseline uses the same features its own way), on the same data, batch and optimizer:

- eager DDP, mmengine style: the Python model with one DistributedDataParallel per
  submodule (find_unused_parameters=True); submodules a phase does not update run with
  requires_grad=False under no_sync().
- StyleGAN3 style: the Python model without DDP; after backward every non-None gradient is
  flattened into one buffer, all-reduced once and divided by the world size.
- ganc: `ganc compile` + `ganc run --nproc 2`.

Prints steps/s, the ratio of ganc to each baseline, and ganc's host overhead per step (the
part of a step spent outside forward, backward, all-reduce waits and the optimizer).

    python3 bench/bench_cpu.py [--steps-mlp 300] [--steps-dcgan 40] [--nproc 2]
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
from ganc.oracle import Inputs, free_port, grad_scalers, _optimizer  # noqa: E402
import zoo  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402

GANC = os.environ.get("GANC", os.path.join(ROOT, "build", "tools", "ganc"))


def _baseline_worker(rank, world, port, model, data_path, steps, warmup, style, result_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    gan, spec = zoo.build(model)
    spec = ganc.validate(spec)
    gan.train()
    data = torch.load(data_path)
    data = (data["images"] if isinstance(data, dict) else data).float()
    inputs = Inputs(spec, data, rank, world, seed=0)
    subs = sorted({u for p in spec["phases"] for u in p["updates"]})
    optimizers = {s: _optimizer(list(getattr(gan, s).parameters()), spec["optimizers"][s]) for s in subs}
    if style == "ddp":
        wrapped = {s: DDP(getattr(gan, s), find_unused_parameters=True, broadcast_buffers=False) for s in subs}
        for s, w in wrapped.items():
            setattr(gan, s, w)  # the phase methods now call through DDP
    scalers = grad_scalers(spec)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        baselines.iteration(gan, spec, subs, inputs, optimizers, style, world, scalers=scalers)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(times[warmup:], f)
    dist.destroy_process_group()


def baseline(model, data, steps, warmup, style, world, tmp):
    result = os.path.join(tmp, f"{model}_{style}.json")
    mp.spawn(_baseline_worker, args=(world, free_port(), model, data, steps, warmup, style, result),
             nprocs=world, join=True)
    return statistics.median(json.load(open(result)))


def run_ganc(model, data, steps, warmup, world, tmp):
    gan, spec = zoo.build(model)
    archive = os.path.join(tmp, model + ".pt")
    plan = os.path.join(tmp, model + ".plan")
    ganc.export(gan, archive, spec)
    subprocess.run([GANC, "compile", archive, "-o", plan], check=True)
    out = os.path.join(tmp, model + "_ganc")
    subprocess.run([GANC, "run", "--nproc", str(world), plan, "--model", archive, "--data", data,
                    "--steps", str(steps), "--seed", "0", "--out", out, "--sample-every", "0",
                    "--checkpoint-every", "0", "--log-every", str(steps), "--force", "--tensorboard", "off"],
                   check=True, stdout=subprocess.DEVNULL)
    timing = json.load(open(os.path.join(out, "timing.json")))
    return (statistics.median(timing["step_seconds"][warmup:]),
            statistics.median(timing["overhead_seconds"][warmup:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps-mlp", type=int, default=300)
    parser.add_argument("--steps-dcgan", type=int, default=40)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, steps in (("ring", 0), ("digits", 0)):
            subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), name, "-o",
                            os.path.join(tmp, name + ".pt")], check=True, stdout=subprocess.DEVNULL)
        for model, data, steps in (("mlp", "ring", args.steps_mlp), ("dcgan32", "digits", args.steps_dcgan),
                                   ("dcgan32_amp", "digits", args.steps_dcgan)):
            data = os.path.join(tmp, data + ".pt")
            warmup = max(2, steps // 10)
            ddp = baseline(model, data, steps, warmup, "ddp", args.nproc, tmp)
            flat = baseline(model, data, steps, warmup, "flat", args.nproc, tmp)
            step, overhead = run_ganc(model, data, steps, warmup, args.nproc, tmp)
            rows.append((model, 1 / ddp, 1 / flat, 1 / step, ddp / step, flat / step, overhead))
    print(f"\n{args.nproc} Gloo ranks on {os.cpu_count()} CPU cores; median step time after warm-up")
    print(f"{'model':12} {'eager DDP':>10} {'StyleGAN3':>10} {'ganc':>10} {'vs DDP':>8} {'vs SG3':>8} {'ganc host overhead':>20}")
    print(f"{'':12} {'steps/s':>10} {'steps/s':>10} {'steps/s':>10}")
    for model, d, f, g, rd, rf, ov in rows:
        print(f"{model:12} {d:10.1f} {f:10.1f} {g:10.1f} {rd:7.2f}x {rf:7.2f}x {ov * 1e6:15.0f} us/step")


if __name__ == "__main__":
    main()
