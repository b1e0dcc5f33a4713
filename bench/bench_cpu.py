"""CPU benchmark: ganc on 2 Gloo ranks against the two ways people train GANs with PyTorch.

In one run, for the MLP GAN, DCGAN-32 and DCGAN-32 with the training-step features of GPU
recipes (dcgan32_amp: bfloat16 autocast, a GradScaler, D accumulating 2 micro-batches, G
clipped; dcgan32_all: those and synchronised batch norm in G; each baseline uses the same
features its own way), on the same data, batch and optimizer:

- eager DDP, mmengine style: the Python model with one DistributedDataParallel per
  submodule (find_unused_parameters=True); submodules a phase does not update run with
  requires_grad=False under no_sync().
- StyleGAN3 style: the Python model without DDP; after backward every non-None gradient is
  flattened into one buffer, all-reduced once and divided by the world size.
- ganc: `ganc compile` + `ganc run --nproc 2`.

Prints steps/s, the ratio of ganc to each baseline, and ganc's host overhead per step (the
part of a step spent outside forward, backward, all-reduce waits and the optimizer).

    python3 bench/bench_cpu.py [--steps-mlp 300] [--steps-dcgan 40] [--nproc 2]
    python3 bench/bench_cpu.py --zero [--repeats 3]   # sharded optimizer state (ZeRO)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import results  # noqa: E402  (first: the repository's python/ and models/ on sys.path)
from results import GANC, ROOT  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ganc  # noqa: E402
from ganc.reference import Inputs, free_port, grad_scalers, make_optimizer  # noqa: E402
import zoo  # noqa: E402

import baselines  # noqa: E402



def _state_bytes(optimizer):
    """Bytes of optimizer state this rank holds (a ZeroRedundancyOptimizer: its shard's)."""
    inner = getattr(optimizer, "optim", optimizer)
    return sum(t.nbytes for state in inner.state.values() for t in state.values() if torch.is_tensor(t))


def _baseline_worker(rank, world, port, model, data_path, steps, warmup, style, result_path, zero=False):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    gan, spec = zoo.build(model)
    spec = ganc.validate(spec)
    gan.train()
    baselines.synchronise_batch_norm(gan, spec.get("sync_batch_norm", []))
    data = torch.load(data_path)
    data = (data["images"] if isinstance(data, dict) else data).float()
    inputs = Inputs(spec, data, rank, world, seed=0)
    subs = sorted({u for p in spec["phases"] for u in p["updates"]})
    optimizers = {s: make_optimizer(list(getattr(gan, s).parameters()), spec["optimizers"][s], zero=zero)
                  for s in subs}
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
            json.dump({"times": times[warmup:],
                       "state_bytes": sum(_state_bytes(o) for o in optimizers.values())}, f)
    dist.destroy_process_group()


def baseline(model, data, steps, warmup, style, world, tmp, zero=False, state=False):
    result = os.path.join(tmp, f"{model}_{style}.json")
    mp.spawn(_baseline_worker, args=(world, free_port(), model, data, steps, warmup, style, result, zero),
             nprocs=world, join=True)
    measured = json.load(open(result))
    step = statistics.median(measured["times"])
    return (step, measured["state_bytes"]) if state else step


def run_ganc(model, data, steps, warmup, world, tmp, zero=0, state=False):
    gan, spec = zoo.build(model)
    archive = os.path.join(tmp, model + ".pt")
    plan = os.path.join(tmp, model + ".plan")
    if not os.path.exists(plan):
        ganc.export(gan, archive, spec)
        subprocess.run([GANC, "compile", archive, "-o", plan], check=True, stderr=subprocess.DEVNULL)
    out = os.path.join(tmp, model + "_ganc")
    subprocess.run([GANC, "run", "--nproc", str(world), plan, "--model", archive, "--data", data,
                    "--steps", str(steps), "--seed", "0", "--out", out, "--sample-every", "0",
                    "--checkpoint-every", "0", "--log-every", str(steps), "--force", "--tensorboard", "off",
                    "--zero", str(zero)],
                   check=True, stdout=subprocess.DEVNULL)
    timing = json.load(open(os.path.join(out, "timing.json")))
    step = statistics.median(timing["step_seconds"][warmup:])
    if state:
        summary = json.load(open(os.path.join(out, "summary.json")))
        return step, (summary["optimizer_state_bytes"], summary["gradient_buffer_bytes"])
    return (step, statistics.median(timing["overhead_seconds"][warmup:]))


def sharding(args, tmp):
    """Sharded optimizer state: ganc unsharded, zero 1 and zero 2 (interleaved, best of
    --repeats medians, as this machine's timings wander) against eager DDP with
    ZeroRedundancyOptimizer; then rank 0's optimizer state and gradient buffers, also for
    StyleGAN2 (four phases: two regularisers beside the main D and G steps)."""
    rows, memory = [], []
    for model, data, steps in (("mlp", "ring", args.steps_mlp), ("dcgan32", "digits", args.steps_dcgan)):
        data = os.path.join(tmp, data + ".pt")
        warmup = max(2, steps // 10)
        best, state = {}, {}
        for _ in range(args.repeats):
            for zero in (0, 1, 2):
                step, state[zero] = run_ganc(model, data, steps, warmup, args.nproc, tmp, zero, state=True)
                best[zero] = min(best.get(zero, step), step)
        eager, eager_state = baseline(model, data, steps, warmup, "ddp", args.nproc, tmp, zero=True, state=True)
        rows.append((model, best, eager))
        memory.append((model, state, eager_state))
    state = {zero: run_ganc("stylegan2", os.path.join(tmp, "digits.pt"), 4, 1, args.nproc, tmp, zero,
                            state=True)[1] for zero in (0, 2)}
    memory.append(("stylegan2", state, None))
    print(f"\nsharded optimizer state, {args.nproc} Gloo ranks: steps/s (best of {args.repeats} medians)")
    print(f"{'model':10} {'ganc':>8} {'zero 1':>8} {'zero 2':>8} {'DDP+ZeRO':>9} {'z1/ganc':>8} {'z2/ganc':>8}"
          f" {'z2/DDP+ZeRO':>12}")
    for model, best, eager in rows:
        print(f"{model:10} {1 / best[0]:8.1f} {1 / best[1]:8.1f} {1 / best[2]:8.1f} {1 / eager:9.1f}"
              f" {best[0] / best[1]:7.2f}x {best[0] / best[2]:7.2f}x {eager / best[2]:11.2f}x")
    print(f"\nper rank (rank 0), KiB: {'optimizer state':>30} {'gradient buffers':>24}")
    print(f"{'model':10} {'ganc':>10} {'zero 2':>10} {'DDP+ZeRO':>10} {'ganc':>12} {'zero 2':>10}")
    for model, state, eager_state in memory:
        eager = f"{eager_state / 1024:10.0f}" if eager_state is not None else f"{'-':>10}"
        print(f"{model:10} {state[0][0] / 1024:10.0f} {state[2][0] / 1024:10.0f} {eager}"
              f" {state[0][1] / 1024:12.0f} {state[2][1] / 1024:10.0f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps-mlp", type=int, default=300)
    parser.add_argument("--steps-dcgan", type=int, default=40)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--zero", action="store_true",
                        help="only the sharded optimizer state comparison")
    parser.add_argument("--repeats", type=int, default=3, help="ganc runs per stage (--zero)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, steps in (("ring", 0), ("digits", 0)):
            subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), name, "-o",
                            os.path.join(tmp, name + ".pt")], check=True, stdout=subprocess.DEVNULL)
        if args.zero:
            sharding(args, tmp)
            return
        for model, data, steps in (("mlp", "ring", args.steps_mlp), ("dcgan32", "digits", args.steps_dcgan),
                                   ("dcgan32_amp", "digits", args.steps_dcgan),
                                   ("dcgan32_all", "digits", args.steps_dcgan)):
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
    results.write(
        "cpu", f"Training steps per second on {args.nproc} Gloo ranks: ganc against eager DDP (one DDP "
        "per submodule, find_unused_parameters=True) and StyleGAN3's flat all-reduce, median step "
        "after warm-up, measured in the same run",
        {model: {"eager_ddp_steps_per_second": d, "stylegan3_steps_per_second": f,
                 "ganc_steps_per_second": g, "ganc_vs_ddp": rd, "ganc_vs_stylegan3": rf,
                 "ganc_host_overhead_seconds": ov} for model, d, f, g, rd, rf, ov in rows},
        {"columns": ["model", "eager DDP steps/s", "StyleGAN3-style steps/s", "ganc steps/s",
                     "ganc vs DDP", "ganc vs StyleGAN3", "ganc host overhead"],
         "rows": [[model, f"{d:.1f}", f"{f:.1f}", f"{g:.1f}", f"{rd:.2f}x", f"{rf:.2f}x",
                   f"{ov * 1e6:.0f} us/step"] for model, d, f, g, rd, rf, ov in rows]})


if __name__ == "__main__":
    main()
