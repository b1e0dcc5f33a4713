"""Checks `ganc simulate` against measurements on this machine.

1. Measures Gloo's all-reduce on 2 local ranks at sizes from 4 KiB to 8 MiB for the
   alpha-beta model (2 ranks: t = 2 alpha + B / beta; alpha from 4 KiB, beta from the slope
   between 4 and 8 MiB; mean times, as the model predicts mean steps), and the host's compute
   throughput in
   cores: one-thread matrix products, alone and one per CPU at once (two hyper-threads of
   one core give less than two).
2. Profiles each model on 1 rank (`ganc train --profile`, one thread).
3. Predicts 2, 3 and 4 ranks with `ganc simulate` (those alpha and beta, every rank on this
   host, sharing its cores), then trains at 2, 3 and 4 ranks (one thread each, profiled) and
   prints predicted against measured step time (mean after warm-up), and the communication
   left exposed after backward per step, predicted against measured (the profile's
   all_reduced_seconds - forward_backward_seconds, weighted by runs per step), which tells a
   miss in the communication model from one in compute.

    python3 bench/scaling.py [--steps 40] [--worlds 2,3,4] [--models dcgan32,mlp]
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

import ganc  # noqa: E402
from ganc.reference import free_port  # noqa: E402
import zoo  # noqa: E402

SIZES = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20]
ROUNDS = 6
DATA = {"mlp": "ring", "dcgan32": "digits"}


def time_all_reduces(sizes, rounds, result):
    """In an initialised process group: the mean and the median time of an all-reduce of each
    size (bytes), written by rank 0 to `result` as JSON. Every size is sampled in each of
    `rounds` rounds, so that a slow spell of the host lands on all sizes alike. The model is
    fitted to the means: it predicts mean step times, and on a host whose idle CPUs must be
    woken, the all-reduce's time is bimodal (here about half the 64-640 KiB all-reduces take
    0.4-0.9 ms and half 3-4 ms), which a median does not weigh."""
    tensors = {size: torch.zeros(size // 4) for size in sizes}
    for t in tensors.values():
        for _ in range(3):
            dist.all_reduce(t)
    samples = {size: [] for size in sizes}
    for _ in range(rounds):
        for size, t in tensors.items():
            for _ in range(8):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(t)
                samples[size].append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        with open(result, "w") as f:
            json.dump({"mean": {size: statistics.mean(s) for size, s in samples.items()},
                       "median": {size: statistics.median(s) for size, s in samples.items()}}, f)


def fit_alpha_beta(result, sizes):
    """(alpha seconds, beta bytes/s) of a 2-rank all-reduce (t = 2 alpha + B / beta) from
    time_all_reduces' `result`: alpha from the smallest size's mean, beta from the slope
    between the largest two."""
    times = {int(k): v for k, v in json.load(open(result))["mean"].items()}
    small, big, bigger = sizes[0], sizes[-2], sizes[-1]
    beta = (bigger - big) / max(times[bigger] - times[big], 1e-9)
    alpha = max(times[small] - small / beta, 1e-6) / 2
    return alpha, beta


def step_and_exposed(out, profile, steps):
    """A profiled run's mean step seconds after warm-up (as the simulator predicts: phases
    with an interval, like StyleGAN2's R1 every 16 steps, lengthen only some steps, which a
    median would leave out), and the communication its profile measured exposed per step."""
    timing = json.load(open(os.path.join(out, "timing.json")))
    p = json.load(open(profile))
    exposed = sum((ph["all_reduced_seconds"] - ph["forward_backward_seconds"]) * ph["runs"] / p["steps"]
                  for ph in p["phases"])
    return statistics.mean(timing["step_seconds"][max(2, steps // 5):]), exposed


def _link_worker(rank, world, port, result):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    time_all_reduces(SIZES, ROUNDS, result)
    dist.destroy_process_group()


def measure_link(tmp):
    """(alpha seconds, beta bytes/s) of Gloo's all-reduce on 2 local ranks."""
    result = os.path.join(tmp, "link.json")
    mp.spawn(_link_worker, args=(2, free_port(), result), nprocs=2, join=True)
    times = json.load(open(result))
    print("Gloo all-reduce, 2 local ranks, ms (median / mean): " +
          ", ".join(f"{int(k) >> 10} KiB {times['median'][k] * 1e3:.2f} / {times['mean'][k] * 1e3:.2f}"
                    for k in times["mean"]))
    return fit_alpha_beta(result, SIZES)


def _compute_worker(index, seconds):
    torch.set_num_threads(1)
    a = torch.randn(192, 192)
    for _ in range(20):
        a @ a
    start = time.perf_counter()
    for _ in range(400):
        a @ a
    seconds[index] = time.perf_counter() - start


def measure_cores():
    """Effective cores: how many one-thread workers' worth of work the host does at once."""
    cpus = os.cpu_count() or 1
    alone = mp.get_context("spawn").Array("d", 1)
    p = mp.get_context("spawn").Process(target=_compute_worker, args=(0, alone))
    p.start()
    p.join()
    together = mp.get_context("spawn").Array("d", cpus)
    workers = [mp.get_context("spawn").Process(target=_compute_worker, args=(i, together))
               for i in range(cpus)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return cpus * alone[0] / statistics.mean(together[:])


def train(plan, archive, data, world, steps, out, profile):
    """Mean step seconds after warm-up, and the profile's exposed communication per step."""
    subprocess.run([GANC, "run", "--nproc", str(world), plan, "--model", archive, "--data", data,
                    "--steps", str(steps), "--seed", "0", "--out", out, "--force", "--threads", "1",
                    "--sample-every", "0", "--checkpoint-every", "0", "--log-every", str(steps),
                    "--tensorboard", "off", "--profile", profile], check=True, stdout=subprocess.DEVNULL)
    return step_and_exposed(out, profile, steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--worlds", default="2,3,4")
    parser.add_argument("--models", default="dcgan32,mlp")
    args = parser.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        alpha, beta = measure_link(tmp)
        cores = measure_cores()
        print(f"Gloo all-reduce, 2 local ranks: alpha {alpha * 1e6:.1f} us, beta {beta / 1e9:.2f} GB/s;"
              f" compute: {cores:.2f} effective cores of {os.cpu_count()}")
        rows = []
        for model in args.models.split(","):
            data = os.path.join(tmp, DATA[model] + ".pt")
            subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), DATA[model],
                            "-o", data], check=True, stdout=subprocess.DEVNULL)
            gan, spec = zoo.build(model)
            archive, plan = os.path.join(tmp, model + ".pt"), os.path.join(tmp, model + ".plan")
            ganc.export(gan, archive, spec)
            subprocess.run([GANC, "compile", archive, "-o", plan], check=True, stderr=subprocess.DEVNULL)
            profile = os.path.join(tmp, model + ".profile.json")
            one, _ = train(plan, archive, data, 1, args.steps, os.path.join(tmp, "run1"), profile)
            predicted = json.loads(subprocess.run(
                [GANC, "simulate", plan, "--profile", profile, "--gpus", ",".join(map(str, worlds)),
                 "--ranks-per-host", str(max(worlds)), "--cores-per-host", str(cores),
                 "--alpha-us", str(alpha * 1e6), "--bandwidth-gbps", str(beta / 1e9), "--json"],
                check=True, capture_output=True, text=True).stdout)
            for p in predicted:
                measured, exposed = train(plan, archive, data, p["ranks"], args.steps, os.path.join(tmp, "run"),
                                          os.path.join(tmp, "measured.json"))
                rows.append((model, p["ranks"], one, p["step_seconds"], measured, p["exposed_seconds"], exposed))
    print(f"\npredicted against measured step time, {cores:.2f} effective cores, one thread per rank")
    print(f"{'model':10} {'ranks':>5} {'1 rank ms':>10} {'predicted ms':>13} {'measured ms':>12} {'error':>8}"
          f"   {'exposed: predicted ms':>21} {'measured ms':>12}")
    for model, ranks, one, predicted, measured, exposed_predicted, exposed in rows:
        print(f"{model:10} {ranks:5d} {one * 1e3:10.2f} {predicted * 1e3:13.2f} {measured * 1e3:12.2f}"
              f" {100 * (predicted - measured) / measured:7.1f}%   {exposed_predicted * 1e3:21.2f}"
              f" {exposed * 1e3:12.2f}")
    results.write(
        "cpu_scaling", "ganc simulate's predicted step time against the measured one at each world "
        f"size (Gloo, one host, {cores:.2f} effective cores, one thread per rank)",
        {"alpha_seconds": alpha, "beta_bytes_per_second": beta, "effective_cores": cores,
         "rows": [{"model": m, "ranks": r, "one_rank_seconds": o, "predicted_seconds": p, "measured_seconds": s,
                   "exposed_predicted_seconds": ep, "exposed_measured_seconds": e}
                  for m, r, o, p, s, ep, e in rows]},
        {"columns": ["model", "ranks", "1 rank ms", "predicted ms", "measured ms", "error"],
         "rows": [[m, r, f"{o * 1e3:.2f}", f"{p * 1e3:.2f}", f"{s * 1e3:.2f}", f"{100 * (p - s) / s:.1f}%"]
                  for m, r, o, p, s, ep, e in rows]})


if __name__ == "__main__":
    main()
