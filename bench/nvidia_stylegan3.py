"""NVIDIA's own stylegan3 networks (`--cfg stylegan3-t` or `stylegan3-r`) through ganc, unchanged,
fused, against eager DDP on their reference ops.

Their code is not in this tree (its licence): pass a checkout of
https://github.com/NVlabs/stylegan3 (kept outside the repository or in a git-ignored folder).
The script builds `training.networks_stylegan3.Generator` (train.py's settings for the
configuration: 2 mapping layers, magnitude EMA; 1x1 convolutions, doubled channels and radial
filters for stylegan3-r) and `networks_stylegan2.Discriminator` at 16 pixels, wraps them in a GAN
module whose phases are StyleGAN2Loss's as train.py sets it for StyleGAN3 (Gmain; Dmain with
`update_emas=True`, as their loss calls G; Dreg, R1 every 16; no path length, no style mixing;
G_ema), exports it with `ganc.export` (no edits to their code), trains the same Python classes
with eager DDP on their reference ops, and trains the archive with ganc at 2 CPU ranks twice:
fused (their `filtered_lrelu` runs its reference path off their CUDA plugin, upfirdn2d +
bias_act, which ganc replaces by ganc::upfirdn2d and ganc::bias_act) and with `--fusion off`;
each against eager DDP, every all-reduced gradient and the final parameters. The results go to
bench/results/nvidia_stylegan3_t.json (or _r).

    python bench/nvidia_stylegan3.py --repo /path/to/stylegan3 [--cfg stylegan3-t] [--steps 17]

Their code imports scipy, requests (dnnlib) and pkg_resources (setuptools < 81).
"""
from __future__ import annotations

import argparse
import json
import copy
import os
import shutil
import subprocess
import sys
import tempfile

import results  # noqa: E402  (first: the repository's python/ and models/ on sys.path)
from results import ROOT  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ganc  # noqa: E402
from ganc import reference  # noqa: E402

REPO = os.environ.get("GANC_STYLEGAN3_REPO", "")
if REPO:
    sys.path.insert(0, REPO)
CFG = os.environ.get("GANC_STYLEGAN3_CFG", "stylegan3-t")
BATCH = 8

class NvidiaStyleGAN3(torch.nn.Module):
    """Their Generator (stylegan3) and Discriminator (stylegan2) at 16 pixels, with the phases
    their StyleGAN2Loss runs for a StyleGAN3 configuration."""

    def __init__(self, cfg: str = CFG):
        super().__init__()
        from training.networks_stylegan2 import Discriminator
        from training.networks_stylegan3 import Generator
        g = dict(channel_base=256, channel_max=32, magnitude_ema_beta=0.5 ** (BATCH / (20 * 1e3)))
        if cfg == "stylegan3-r":  # train.py's settings for stylegan3-r
            g.update(conv_kernel=1, channel_base=512, channel_max=64, use_radial_filters=True)
        self.G = Generator(z_dim=32, c_dim=0, w_dim=32, img_resolution=16, img_channels=3,
                           mapping_kwargs=dict(num_layers=2), **g)
        self.D = Discriminator(c_dim=0, img_resolution=16, img_channels=3, channel_base=256, channel_max=32)
        self.G_ema = copy.deepcopy(self.G).eval().requires_grad_(False)

    def run_G(self, z, update_emas=False):
        c = torch.zeros([z.shape[0], 0])
        ws = self.G.mapping(z, c, update_emas=update_emas)
        return self.G.synthesis(ws, update_emas=update_emas)

    def phase_gmain(self, z):
        c = torch.zeros([z.shape[0], 0])
        return F.softplus(-self.D(self.run_G(z), c)).mean()

    def phase_dmain(self, real, z):
        c = torch.zeros([z.shape[0], 0])
        fake = self.run_G(z, update_emas=True).detach()
        return F.softplus(self.D(fake, c)).mean() + F.softplus(-self.D(real, c)).mean()

    def phase_dreg(self, real):
        c = torch.zeros([real.shape[0], 0])
        x = real.detach().requires_grad_(True)
        grads = torch.autograd.grad([self.D(x, c).sum()], [x], create_graph=True)[0]
        assert grads is not None
        return grads.square().sum([1, 2, 3]).mean() * (2.0 / 2) * 16  # r1_gamma 2, D_reg_interval 16

def spec():
    z = {"name": "z", "source": "normal", "shape": [32]}
    real = {"name": "real", "source": "data"}
    ratio = 16 / 17  # lazy regularisation's mb_ratio for D
    adam_g = {"type": "adam", "lr": 0.0025, "betas": [0.0, 0.99]}
    adam_d = {"type": "adam", "lr": 0.002 * ratio, "betas": [0.0, 0.99 ** ratio]}
    return {"ganc_spec": 1, "name": "nvidia_stylegan3", "batch_size": BATCH, "data": {"shape": [3, 16, 16]},
            "phases": [{"name": "Gmain", "method": "phase_gmain", "updates": ["G"], "inputs": [z]},
                       {"name": "Dmain", "method": "phase_dmain", "updates": ["D"], "inputs": [real, z]},
                       {"name": "Dreg", "method": "phase_dreg", "updates": ["D"], "interval": 16,
                        "inputs": [real]}],
            "optimizers": {"G": adam_g, "D": adam_d},
            "ema": {"submodule": "G", "copy": "G_ema", "half_life_images": 500}}

def side(ganc_bin, model, data, tmp, steps, fusion):
    """ganc's run of the archive with `--fusion` as given, against eager DDP's (run once, in
    tmp/ddp): what it fused and left alone per phase, and results.gradient_parity's numbers."""
    plan = os.path.join(tmp, f"nv-{fusion}.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan, "--fusion", fusion], check=True)
    explained = subprocess.run([ganc_bin, "explain", plan, "--json"], check=True, capture_output=True,
                               text=True).stdout
    phases = {p["name"]: p for p in json.loads(explained)["phases"]}
    shutil.rmtree(os.path.join(tmp, "ganc"), ignore_errors=True)
    subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", data, "--steps", str(steps),
                    "--seed", "3", "--out", os.path.join(tmp, f"run-{fusion}"), "--sample-every", "0",
                    "--checkpoint-every", "0", "--log-every", str(steps), "--fusion", fusion, "--dump-grads",
                    os.path.join(tmp, "ganc")], check=True)
    worst, mismatched, final, tensors = results.gradient_parity(os.path.join(tmp, "ganc"), os.path.join(tmp, "ddp"),
                                                                steps, spec()["phases"])
    return {"fused": {name: p["fused"] for name, p in phases.items()},
            "not_fused": {name: p["not_fused"] for name, p in phases.items()},
            "phases_with_other_parameters_than_ddp": mismatched, "max_relative_gradient_difference": worst,
            "final_parameters_max_relative_difference": final, "final_tensors": tensors}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a checkout of NVlabs/stylegan3")
    parser.add_argument("--cfg", default="stylegan3-t", choices=["stylegan3-t", "stylegan3-r"])
    parser.add_argument("--steps", type=int, default=17)
    parser.add_argument("--build", default=os.environ.get("GANC_BUILD_DIR", os.path.join(ROOT, "build")))
    args = parser.parse_args()
    repo = os.path.abspath(args.repo)
    if not os.path.isfile(os.path.join(repo, "training", "networks_stylegan3.py")):
        raise SystemExit(f"{repo}: no training/networks_stylegan3.py (a stylegan3 checkout is needed)")
    os.environ["GANC_STYLEGAN3_REPO"] = repo  # the eager reference's processes import it too
    os.environ["GANC_STYLEGAN3_CFG"] = args.cfg
    sys.path.insert(0, repo)
    ganc_bin = os.path.join(args.build, "tools", "ganc")
    with tempfile.TemporaryDirectory() as tmp:
        model, data = os.path.join(tmp, "nv.pt"), os.path.join(tmp, "digits16.pt")
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), "digits", "--size", "16",
                        "-o", data], check=True, stdout=subprocess.DEVNULL)
        torch.manual_seed(0)
        ganc.export(NvidiaStyleGAN3(args.cfg), model, spec())
        # R1 leaves parameters without a gradient, which DDP refuses: that phase's reference
        # all-reduces by hand with DDP's arithmetic.
        reference.run(model, data, 2, args.steps, 3, os.path.join(tmp, "ddp"), reducer={"Dreg": "manual"},
                   eager_model=NvidiaStyleGAN3)
        # Fused (the default), and as written: bit for bit expected there.
        by_fusion = {fusion: side(ganc_bin, model, data, tmp, args.steps, fusion) for fusion in ("on", "off")}
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    numbers = {"cfg": args.cfg, "stylegan3_commit": commit or None, "ranks": 2, "steps": args.steps,
               "dtype": "float32", "pixels": 16, "fusion": by_fusion}
    rows = []
    for fusion, found in by_fusion.items():
        for name, w in found["max_relative_gradient_difference"].items():
            rows.append([f"--fusion {fusion}", name, str(found["fused"][name]["upfirdn2d"]),
                         str(found["fused"][name]["bias_act"]), f"{w['first_step']:.2g}", f"{w['all_steps']:.2g}"])
        rows.append([f"--fusion {fusion}", "final parameters", "", "", "",
                     f"{found['final_parameters_max_relative_difference']:.2g}"])
    results.write(f"nvidia_{args.cfg.replace('-', '_')}", f"NVIDIA's {args.cfg} networks, unchanged, through ganc "
                  "fused and unfused, against eager DDP on their reference ops (2 CPU ranks, float32, 16 "
                  "pixels): largest relative difference of the all-reduced gradients",
                  numbers, {"columns": ["run", "phase", "ganc::upfirdn2d", "ganc::bias_act", "first step",
                                        "every step"], "rows": rows})
    print(json.dumps(numbers, indent=1))


if __name__ == "__main__":
    main()
