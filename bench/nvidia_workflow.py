"""A StyleGAN user's whole run with ganc, on NVIDIA's own stylegan2-ada-pytorch code unchanged:
their Generator and Discriminator built with train.py's `paper256` sizes (at 16 pixels here,
in float32: a CPU runs their float16 layers slowly), 8 images per rank and pass,
`ganc.recipes.stylegan2(G, D, cfg="paper256", augment=their AugmentPipe(**bgc))` (ADA on
train.py's default pipe), a data set zip in their dataset_tool's format, `ganc run` at 2 CPU
ranks with `--kimg`, `--tick-kimg` and `--snap`, then `ganc.stylegan_snapshot` and their own
`legacy.load_network_pkl`, whose G_ema generates images as their generate.py calls it.
Records what each stage did (seconds, losses, p, the snapshot's contents) in
bench/results/nvidia_workflow.json.

Their code is not in this tree (its licence): pass a checkout of
https://github.com/NVlabs/stylegan2-ada-pytorch (its dnnlib imports `requests`; its augment.py
`scipy`, its legacy.py `click`).

    python bench/nvidia_workflow.py --repo external/stylegan2-ada-pytorch [--kimg 0.128]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile

import results  # noqa: E402  (first: the repository's python/ and models/ on sys.path)
from results import ROOT  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ganc  # noqa: E402
from ganc import augment, recipes  # noqa: E402


def dataset_zip(path: str, size: int) -> int:
    """scikit-learn's digits as RGB PNGs in a zip with dataset.json, as their dataset_tool writes."""
    from PIL import Image
    from sklearn.datasets import load_digits
    digits = load_digits().images  # [n, 8, 8] in 0..16
    with zipfile.ZipFile(path, "w") as z:
        for i, d in enumerate(digits):
            img = Image.fromarray((d * 255 / 16).astype(np.uint8)).resize((size, size), Image.BILINEAR).convert("RGB")
            buf = io.BytesIO()
            img.save(buf, format="png")
            z.writestr(f"{i // 1000:05d}/img{i:08d}.png", buf.getvalue())
        z.writestr("dataset.json", json.dumps({"labels": None}))
    return len(digits)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="a stylegan2-ada-pytorch checkout")
    parser.add_argument("--kimg", default="0.128")
    parser.add_argument("--build", default=os.environ.get("GANC_BUILD_DIR", os.path.join(ROOT, "build")))
    parser.add_argument("--no-save", action="store_true", help="print only")
    args = parser.parse_args()
    repo = os.path.abspath(args.repo)
    sys.path.insert(0, repo)
    os.environ["PYTHONPATH"] = os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])
    from training.augment import AugmentPipe
    from training.networks import Discriminator, Generator
    import legacy

    ganc_bin = os.path.join(args.build, "tools", "ganc")
    numbers, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "digits16.zip")
        numbers["images"] = dataset_zip(data, 16)
        p = recipes.preset("paper256", 16, gpus=2, batch=16)
        sizes = p.network_kwargs()
        sizes["G"]["synthesis_kwargs"]["num_fp16_res"] = sizes["D"]["num_fp16_res"] = 0
        kwargs = dict(z_dim=sizes["G"]["z_dim"], c_dim=0, w_dim=sizes["G"]["w_dim"], img_resolution=16,
                      img_channels=3, mapping_kwargs=sizes["G"]["mapping_kwargs"],
                      synthesis_kwargs=sizes["G"]["synthesis_kwargs"])
        torch.manual_seed(0)
        G, D = Generator(**kwargs), Discriminator(c_dim=0, img_resolution=16, img_channels=3, **sizes["D"])
        gan, spec = recipes.stylegan2(G, D, cfg="paper256", gpus=2, batch=16, batch_gpu=8,
                                      augment=AugmentPipe(**augment.PIPES["bgc"]))
        model, plan, out = (os.path.join(tmp, n) for n in ("sg2.pt", "sg2.plan", "run"))
        start = time.perf_counter()
        ganc.export(gan, model, spec)
        seconds["export"] = time.perf_counter() - start
        subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True)
        start = time.perf_counter()
        subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", data, "--kimg", args.kimg,
                        "--tick-kimg", "0.064", "--snap", "2", "--out", out, "--tensorboard", "off"], check=True)
        seconds["train"] = time.perf_counter() - start
        stats = [json.loads(line) for line in open(os.path.join(out, "stats.jsonl"))]
        numbers["ticks"] = len(stats)
        numbers["steps"] = int(stats[-1]["step"])
        numbers["losses_finite"] = all(np.isfinite(s[k]["mean"]) for s in stats for k in s
                                       if k.startswith("Loss/") and isinstance(s[k], dict))
        numbers["augment_p"] = [s.get("Controller/augment_p") for s in stats]
        fresh = dict(G=Generator(**kwargs), D=Discriminator(c_dim=0, img_resolution=16, img_channels=3, **sizes["D"]),
                     G_ema=Generator(**kwargs), augment_pipe=AugmentPipe(**augment.PIPES["bgc"]))
        pkl = ganc.stylegan_snapshot(os.path.join(out, "checkpoint.pt"), os.path.join(tmp, "snapshots"), **fresh)
        with open(pkl, "rb") as f:
            loaded = legacy.load_network_pkl(f)  # their loader, as generate.py calls it
        G_ema = loaded["G_ema"]
        images = G_ema(torch.randn(4, G_ema.z_dim), torch.zeros(4, 0), truncation_psi=1, noise_mode="const")
        numbers["snapshot"] = os.path.basename(pkl)
        numbers["snapshot_keys"] = sorted(k for k in loaded if loaded[k] is not None)
        numbers["snapshot_augment_p"] = float(loaded["augment_pipe"].p)
        numbers["generated_shape"] = list(images.shape)
        numbers["generated_finite"] = bool(torch.isfinite(images).all())
    numbers["seconds"] = seconds
    print(json.dumps(numbers, indent=1))
    assert numbers["losses_finite"] and numbers["generated_finite"]
    if not args.no_save:
        rows = [["export, compile, 2-rank run, snapshot, their loader", "NVIDIA's code unchanged",
                 f"{numbers['steps']} steps ({numbers['ticks']} ticks), p {numbers['augment_p'][-1]:.4f}", "ok"]]
        results.write("nvidia_workflow", "A StyleGAN user's run on NVIDIA's stylegan2-ada-pytorch code unchanged: "
                      "paper256 with ADA (bgc), a dataset zip, --kimg/--tick-kimg/--snap on 2 CPU ranks, "
                      "their network pickle loader", numbers,
                      {"columns": ["what", "baseline", "ganc", "result"], "rows": rows})


if __name__ == "__main__":
    main()
