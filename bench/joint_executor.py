"""ganc's own executor of joint graphs against the TorchScript executor, in one run: the zoo's
MLP GAN and DCGAN-32 exported once with `joint=True`, then trained on 2 CPU ranks with
`--executor joint` and `--executor torchscript`, alternating, each configuration several times
(the best images/s of each, ganc's own count of the training loop), with each run's peak
resident memory (the largest rank's) and a check that both executors end at the same
parameters, bit for bit. A model whose networks are autograd Functions (`stylegan2_ada`: StyleGAN2-ADA's
convolutions) does not: its joint graphs hold what the Functions' own backward runs (as eager
PyTorch does), the archive's code the gradients derived from their forwards, float32's last
bits apart (tests/python/test_intake.py checks each against its eager reference).

    python3 bench/joint_executor.py [--steps 400] [--repeats 3] [--models mlp,dcgan32]

Results: bench/results/joint_executor.json.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

import results  # noqa: E402  (first: the repository's python/ and models/ on sys.path)
from results import GANC  # noqa: E402
import ganc  # noqa: E402
import zoo  # noqa: E402

EXECUTORS = ("torchscript", "joint")
# Models whose autograd Functions' own backward (the joint graphs') rounds otherwise than the
# gradient the archive's code derives from their forwards.
OWN_BACKWARD = {"stylegan2_ada": "its autograd Functions' own backward (joint) against the gradient derived from "
                                 "their forwards (TorchScript): float32's last bits, amplified by Adam"}
# Runs one command and prints the largest resident set of its process tree's waited-for
# processes (the ranks, which `ganc run` waits for), in KiB.
PEAK = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")


def prepare(work, model):
    """The model exported with its joint graphs, its plan, and random data of its shape."""
    torch.manual_seed(0)
    gan, spec = zoo.build(model)
    path = os.path.join(work, f"{model}.pt")
    ganc.export(gan, path, spec, joint=True, verbose=False)
    plan = os.path.join(work, f"{model}.plan")
    subprocess.run([GANC, "compile", path, "-o", plan], check=True, capture_output=True)
    data = os.path.join(work, f"{model}-data.pt")
    torch.save(torch.rand([512] + list(spec["data"]["shape"])) * 2 - 1, data)
    return path, plan, data


def train(work, model, executor, steps, path, plan, data):
    out = os.path.join(work, f"{model}-{executor}")
    r = subprocess.run([sys.executable, "-c", PEAK, GANC, "run", "--nproc", "2", plan, "--model", path,
                        "--data", data, "--steps", str(steps), "--out", out, "--force", "--seed", "1",
                        "--sample-every", "0", "--checkpoint-every", str(steps), "--log-every", str(steps),
                        "--tensorboard", "off", "--executor", executor],
                       capture_output=True, text=True, check=True)
    summary = json.load(open(os.path.join(out, "summary.json")))
    return summary["images_per_second"], int(r.stdout.strip().splitlines()[-1]) / 1024.0, out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="mlp,dcgan32")
    args = parser.parse_args()
    numbers = {"steps": args.steps, "repeats": args.repeats, "ranks": 2}
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for model in args.models.split(","):
            path, plan, data = prepare(work, model)
            best = {e: {"images_per_second": 0.0, "peak_rss_mib": 0.0} for e in EXECUTORS}
            outs = {}
            for _ in range(args.repeats):
                for executor in EXECUTORS:
                    speed, peak, outs[executor] = train(work, model, executor, args.steps, path, plan, data)
                    best[executor]["images_per_second"] = max(best[executor]["images_per_second"], speed)
                    best[executor]["peak_rss_mib"] = max(best[executor]["peak_rss_mib"], peak)
            final = {e: ganc.load_checkpoint(os.path.join(outs[e], "checkpoint.pt")) for e in EXECUTORS}
            nets = [k for k, v in final["joint"].items() if isinstance(v, dict) and k in spec_owners(path)]
            same = all(torch.equal(final["joint"][n][p], final["torchscript"][n][p])
                       for n in nets for p in final["torchscript"][n])
            ratio = best["joint"]["images_per_second"] / best["torchscript"]["images_per_second"]
            memory = best["joint"]["peak_rss_mib"] / best["torchscript"]["peak_rss_mib"]
            numbers[model] = {**{e: best[e] for e in EXECUTORS}, "speed_ratio": ratio, "memory_ratio": memory,
                              "same_parameters": same}
            if model in OWN_BACKWARD:
                numbers[model]["why_not_the_same"] = OWN_BACKWARD[model]
            print(f"{model}: joint {best['joint']['images_per_second']:.0f} img/s, torchscript "
                  f"{best['torchscript']['images_per_second']:.0f} img/s ({ratio:.2f}x); peak RSS "
                  f"{best['joint']['peak_rss_mib']:.0f} vs {best['torchscript']['peak_rss_mib']:.0f} MiB "
                  f"({memory:.2f}x); same parameters: {same}")
            rows.append([model, f"{best['torchscript']['images_per_second']:.0f}",
                         f"{best['joint']['images_per_second']:.0f}", f"{ratio:.2f}x", f"{memory:.2f}x"])
    results.write("joint_executor", "Training through the joint executor against the TorchScript executor, "
                  "2 CPU ranks", numbers,
                  table={"columns": ["model", "TorchScript img/s", "joint img/s", "speed", "peak memory"],
                         "rows": rows})


def spec_owners(path):
    """The submodules the spec's optimizers own: the networks a checkpoint keeps by name."""
    return set(ganc.load_spec(path)["optimizers"])


if __name__ == "__main__":
    main()
