"""Records what stylegan2-ada-pytorch's own train.py sets for each `--cfg` preset, at several
resolutions and GPU counts, as the expected values of ganc.recipes' presets
(tests/python/test_recipes.py reads tests/python/data/stylegan2_ada_presets.json).

    python bench/stylegan2_ada_presets.py --repo PATH_TO_NVLABS_STYLEGAN2_ADA_PYTORCH

Each case runs their `train.py --dry-run` (with `--batch` where the case gives one) on a small
generated data set of that resolution and keeps the options it prints; the loss's and training loop's defaults that the options do
not carry (style mixing, path length, lazy-regularisation intervals) are read from their
functions' signatures. Needs their repository's requirements (click, psutil, requests)."""
import argparse
import inspect
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile

import results  # noqa: F401  (python/ and models/ on sys.path)
from results import ROOT

# (cfg, resolution, gpus, --batch or None)
CASES = [("auto", 32, 1, None), ("auto", 64, 2, None), ("auto", 256, 8, None), ("auto", 512, 4, None),
         ("auto", 1024, 8, None), ("stylegan2", 1024, 8, None), ("paper256", 256, 8, None), ("paper512", 512, 8, None),
         ("paper1024", 1024, 8, None), ("cifar", 32, 2, None), ("paper256", 256, 2, 16), ("auto", 64, 2, 8),
         ("stylegan2", 1024, 4, 32)]


def dataset(path, resolution):
    """Four random RGB PNGs in a dataset_tool-style zip."""
    import numpy as np
    from PIL import Image
    with zipfile.ZipFile(path, "w") as z:
        for i in range(4):
            png = io.BytesIO()
            Image.fromarray((np.random.rand(resolution, resolution, 3) * 255).astype(np.uint8)).save(png, "PNG")
            z.writestr(f"img{i:08d}.png", png.getvalue())
        z.writestr("dataset.json", json.dumps({"labels": None}))


def dry_run(repo, data, cfg, gpus, batch, out):
    done = subprocess.run([sys.executable, "train.py", "--outdir", out, "--data", data, "--gpus", str(gpus),
                           "--cfg", cfg, "--dry-run"] + (["--batch", str(batch)] if batch else []),
                          cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"train.py --cfg {cfg} --gpus {gpus} --dry-run failed: {done.stderr.strip()[-500:]}")
    text = done.stdout
    options, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
    return options


def defaults(repo):
    """StyleGAN2Loss's and training_loop's defaults (the options leave them out)."""
    sys.path.insert(0, repo)
    import dnnlib  # noqa: F401  (their package, for the imports below)
    from training import loss, training_loop
    loss_defaults = {k: v.default for k, v in inspect.signature(loss.StyleGAN2Loss.__init__).parameters.items()
                     if v.default is not inspect.Parameter.empty}
    loop = inspect.signature(training_loop.training_loop).parameters
    return {"loss": {k: loss_defaults[k] for k in ("style_mixing_prob", "pl_batch_shrink", "pl_decay", "pl_weight")},
            "G_reg_interval": loop["G_reg_interval"].default, "D_reg_interval": loop["D_reg_interval"].default}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", required=True, help="a checkout of NVlabs/stylegan2-ada-pytorch")
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "python", "data", "stylegan2_ada_presets.json"))
    args = parser.parse_args()
    repo = os.path.abspath(args.repo)
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for cfg, resolution, gpus, batch in CASES:
            data = os.path.join(tmp, f"data{resolution}.zip")
            if not os.path.exists(data):
                dataset(data, resolution)
            o = dry_run(repo, data, cfg, gpus, batch, os.path.join(tmp, "out"))
            cases.append({"cfg": cfg, "resolution": resolution, "gpus": gpus, "batch": batch, "options": {
                k: o[k] for k in ("G_kwargs", "D_kwargs", "G_opt_kwargs", "D_opt_kwargs", "loss_kwargs", "total_kimg",
                                  "batch_size", "batch_gpu", "ema_kimg", "ema_rampup") if k in o}})
            print(f"{cfg} at {resolution} pixels on {gpus} GPU(s): batch {o['batch_size']}, gamma "
                  f"{o['loss_kwargs']['r1_gamma']}", flush=True)
    record = {"what": "stylegan2-ada-pytorch train.py --dry-run options per preset (bench/stylegan2_ada_presets.py)",
              "repository": "NVlabs/stylegan2-ada-pytorch", "commit": commit or "unknown",
              "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
              "defaults": defaults(repo), "cases": cases}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
