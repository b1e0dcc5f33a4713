"""NVIDIA's own stylegan2-ada-pytorch networks through ganc, unchanged, against eager DDP.

Their code is not in this tree (its licence): pass a checkout of
https://github.com/NVlabs/stylegan2-ada-pytorch (kept outside the repository or in a
git-ignored folder). The script builds `training.networks.Generator` and `Discriminator` at a
small size, wraps them in a GAN module whose phases are StyleGAN2Loss's (Gmain, Gpl path length
every 4, Dmain, Dreg R1 every 16, G_ema), exports it with `ganc.export` (no edits to their code),
compiles it, trains it with ganc at 2 CPU ranks, trains the same Python classes with eager
DDP (their own autograd Functions, the reference bias_act/upfirdn2d they use on CPU), and
compares every all-reduced gradient and the final parameters. The results go to
bench/results/nvidia_stylegan2_ada.json (machine, date, command, every number).

    python bench/nvidia_stylegan2_ada.py --repo /path/to/stylegan2-ada-pytorch [--steps 17]

Their `dnnlib` imports `requests`: have it importable (pip install requests).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile

import results  # noqa: E402  (first: the repository's python/ and models/ on sys.path)
from results import HERE, ROOT  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ganc  # noqa: E402
from ganc import reference  # noqa: E402


REPO = os.environ.get("GANC_STYLEGAN2_ADA_REPO", "")
if REPO:
    sys.path.insert(0, REPO)


class NvidiaStyleGAN2(torch.nn.Module):
    """Their Generator and Discriminator with StyleGAN2Loss's phases (16 pixels, 32 channels)."""

    def __init__(self):
        super().__init__()
        from training.networks import Discriminator, Generator
        self.G = Generator(z_dim=32, c_dim=0, w_dim=32, img_resolution=16, img_channels=3,
                           mapping_kwargs=dict(num_layers=2),
                           synthesis_kwargs=dict(channel_base=512, channel_max=32))
        self.D = Discriminator(c_dim=0, img_resolution=16, img_channels=3, channel_base=512, channel_max=32)
        self.G_ema = copy.deepcopy(self.G).eval().requires_grad_(False)
        self.register_buffer("pl_mean", torch.zeros([]))

    def phase_gmain(self, z):
        c = torch.zeros([z.shape[0], 0])
        return F.softplus(-self.D(self.G.synthesis(self.G.mapping(z, c)), c)).mean()

    def phase_gpl(self, z):
        z = z[:z.shape[0] // 2]
        c = torch.zeros([z.shape[0], 0])
        ws = self.G.mapping(z, c)
        img = self.G.synthesis(ws)
        noise = torch.randn_like(img) / math.sqrt(img.shape[2] * img.shape[3])
        grads = torch.autograd.grad([(img * noise).sum()], [ws], create_graph=True)[0]
        assert grads is not None
        lengths = grads.square().sum(2).mean(1).sqrt()
        pl_mean = self.pl_mean.lerp(lengths.mean().detach(), 0.01)
        self.pl_mean.copy_(pl_mean)
        return (lengths - pl_mean).square().mean() * 2.0 * 4

    def phase_dmain(self, real, z):
        c = torch.zeros([z.shape[0], 0])
        fake = self.G.synthesis(self.G.mapping(z, c)).detach()
        return F.softplus(self.D(fake, c)).mean() + F.softplus(-self.D(real, c)).mean()

    def phase_dreg(self, real):
        c = torch.zeros([real.shape[0], 0])
        x = real.detach().requires_grad_(True)
        grads = torch.autograd.grad([self.D(x, c).sum()], [x], create_graph=True)[0]
        assert grads is not None
        return grads.square().sum([1, 2, 3]).mean() * 0.5 * 16


def spec():
    z = {"name": "z", "source": "normal", "shape": [32]}
    real = {"name": "real", "source": "data"}
    adam = {"type": "adam", "lr": 0.002, "betas": [0.0, 0.99]}
    return {"ganc_spec": 1, "name": "nvidia_stylegan2_ada", "batch_size": 8, "data": {"shape": [3, 16, 16]},
            "phases": [{"name": "Gmain", "method": "phase_gmain", "updates": ["G"], "inputs": [z]},
                       {"name": "Gpl", "method": "phase_gpl", "updates": ["G"], "interval": 4, "inputs": [z]},
                       {"name": "Dmain", "method": "phase_dmain", "updates": ["D"], "inputs": [real, z]},
                       {"name": "Dreg", "method": "phase_dreg", "updates": ["D"], "interval": 16,
                        "inputs": [real]}],
            "optimizers": {"G": adam, "D": dict(adam)},
            "ema": {"submodule": "G", "copy": "G_ema", "half_life_images": 500}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a checkout of NVlabs/stylegan2-ada-pytorch")
    parser.add_argument("--steps", type=int, default=17)
    parser.add_argument("--build", default=os.environ.get("GANC_BUILD_DIR", os.path.join(ROOT, "build")))
    args = parser.parse_args()
    repo = os.path.abspath(args.repo)
    if not os.path.isfile(os.path.join(repo, "training", "networks.py")):
        raise SystemExit(f"{repo}: no training/networks.py (a stylegan2-ada-pytorch checkout is needed)")
    os.environ["GANC_STYLEGAN2_ADA_REPO"] = repo  # the eager reference's processes import it too
    sys.path.insert(0, repo)
    ganc_bin = os.path.join(args.build, "tools", "ganc")
    with tempfile.TemporaryDirectory() as tmp:
        model, plan, data = (os.path.join(tmp, n) for n in ("nv.pt", "nv.plan", "digits16.pt"))
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), "digits", "--size", "16",
                        "-o", data], check=True, stdout=subprocess.DEVNULL)
        torch.manual_seed(0)
        ganc.export(NvidiaStyleGAN2(), model, spec())
        subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True)
        explained = subprocess.run([ganc_bin, "explain", plan], check=True, capture_output=True, text=True).stdout
        subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", data, "--steps",
                        str(args.steps), "--seed", "3", "--out", os.path.join(tmp, "run"), "--sample-every", "0",
                        "--checkpoint-every", "0", "--log-every", str(args.steps), "--dump-grads",
                        os.path.join(tmp, "ganc")], check=True)
        # Both regularisers leave parameters without a gradient, which DDP refuses: those
        # phases' reference all-reduces by hand with DDP's arithmetic.
        reference.run(model, data, 2, args.steps, 3, os.path.join(tmp, "ddp"),
                   reducer={"Gpl": "manual", "Dreg": "manual"}, eager_model=NvidiaStyleGAN2)
        worst, mismatched, final, tensors = results.gradient_parity(
            os.path.join(tmp, "ganc"), os.path.join(tmp, "ddp"), args.steps, spec()["phases"])
        got = ganc.load_checkpoint(os.path.join(tmp, "ganc", "params_final.pt"))
        ref = torch.load(os.path.join(tmp, "ddp", "params_final.pt"))
        result = {
            "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)",
            "date": datetime.date.today().isoformat(),
            "command": " ".join(sys.argv),
            "stylegan2_ada_commit": subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                                                   text=True).stdout.strip() or None,
            "ranks": 2, "steps": args.steps, "dtype": "float32",
            "replayed_as_cuda_graphs": explained.count("replay on CUDA: CUDA Graph"),
            "phases_with_other_parameters_than_ddp": mismatched,
            "max_relative_gradient_difference": {name: w["all_steps"] for name, w in worst.items()},
            "final_parameters_max_relative_difference": final,
            "final_tensors_bitwise_equal": sum(torch.equal(got[k], ref[k]) for k in ref),
            "final_tensors": tensors,
        }
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", "nvidia_stylegan2_ada.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
