"""`ganc stylegan`, a StyleGAN2 run in one command shaped like NVIDIA's train.py: on 2 CPU ranks
with the zoo's StyleGAN2-ADA-style networks (written as NVIDIA's, their constructor
signatures), against the path docs/model.md describes by hand (recipes.stylegan2, export,
compile, `ganc train`): the same training bit for bit, also when the command is interrupted and
continued with `--resume RUN_DIR`; the network pickles it writes while training hold what
StyleGAN's training loop pickles, with the trained weights and ADA's p."""
from __future__ import annotations

import copy
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

import ganc
from ganc import recipes, stylegan
from conftest import tensors_of

SIZE = 16
# 256 digits at 16 pixels; 2 ranks of 4 images (--batch 8), 1 kimg: 125 steps, a tick every 4
# steps, a snapshot every 8 ticks.
COMMAND = ["--networks", "zoo.stylegan2_ada", "--gpus", "2", "--device", "cpu", "--cfg", "auto", "--cbase", "512",
           "--cmax", "32", "--map-depth", "2", "--batch", "8", "--kimg", "1", "--tick", "0.032", "--snap", "8",
           "--metrics", "none", "--mirror", "1"]


def dataset_zip(path: str, count: int = 256) -> str:
    """scikit-learn's digits as RGB PNGs with their labels in dataset.json, as NVIDIA's
    dataset_tool.py writes a zip."""
    from PIL import Image
    from sklearn.datasets import load_digits
    digits = load_digits()
    labels = []
    with zipfile.ZipFile(path, "w") as z:
        for i, d in enumerate(digits.images[:count]):
            img = Image.fromarray((d * 255 / 16).astype(np.uint8)).resize((SIZE, SIZE), Image.BILINEAR).convert("RGB")
            buf = io.BytesIO()
            img.save(buf, format="png")
            name = f"{i // 1000:05d}/img{i:08d}.png"
            z.writestr(name, buf.getvalue())
            labels.append([name, int(digits.target[i])])
        z.writestr("dataset.json", json.dumps({"labels": labels}))
    return path


ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The command imports --networks zoo.stylegan2_ada as a user's module: the zoo on its path.
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "models"), os.path.join(ROOT, "python"),
                                                   os.environ.get("PYTHONPATH", "")]))


def command(*args) -> list[str]:
    return [sys.executable, "-m", "ganc.stylegan", *args]


def by_hand(data: str, out: str) -> str:
    """docs/model.md's path: train.py's sizes for `auto` at 16 pixels on 2 GPUs, with the
    command's overrides, the networks built after seeding 0, recipes.stylegan2 with ADA on
    `bgc` and x-flips, exported, compiled and trained with the command's run options."""
    from zoo.stylegan2_ada import Discriminator, Generator
    overrides = dict(batch=8, fmaps=512 / 32768, map=2)
    nets = recipes.preset("auto", SIZE, gpus=2, **overrides).network_kwargs()
    for kw in (nets["G"]["synthesis_kwargs"], nets["D"]):
        kw.update(channel_max=32, num_fp16_res=0, conv_clamp=None)
    torch.manual_seed(0)
    G = Generator(**nets["G"], c_dim=0, img_resolution=SIZE, img_channels=3)
    D = Discriminator(**nets["D"], c_dim=0, img_resolution=SIZE, img_channels=3)
    gan, spec = recipes.stylegan2(G, D, cfg="auto", gpus=2, augment="bgc", **overrides)
    spec["data"]["xflip"] = True
    os.makedirs(out)
    archive = os.path.join(out, "model.pt")
    ganc.export(gan, archive, spec, verbose=False)
    plan = ganc.compile(archive, os.path.join(out, "model.plan"))
    ganc.train(plan, archive, data, nproc=2, out=os.path.join(out, "run"), quiet=True, kimg=1, tick_kimg=0.032,
               snap=8, seed=0, device="cpu")
    return os.path.join(out, "run")


def test_one_command_trains_as_the_recipe_by_hand_and_pickles_while_training(tmp_path):
    data = dataset_zip(str(tmp_path / "digits16.zip"))
    outdir = tmp_path / "runs"
    # The command, interrupted (Ctrl-C) once its first network pickle is written ...
    proc = subprocess.Popen(command("--outdir", str(outdir), "--data", data, *COMMAND), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "ganc stylegan: wrote" in line and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    assert proc.wait() == 130, "".join(lines[-20:])
    run_dir = outdir / "00000-digits16-mirror-auto2-kimg1-batch8"  # train.py's name for these options
    assert "Output directory:   " + str(run_dir) in "".join(lines)
    first = sorted(p.name for p in run_dir.glob("network-snapshot-*.pkl"))
    assert first == ["network-snapshot-000000.pkl"], first  # written while training
    summary = json.loads((run_dir / "training_options.json").read_text())
    assert summary["spec"]["batch_size"] == 4 and "accumulate" not in summary["spec"]["phases"][0]
    # ... then continued exactly from its checkpoint, with the options it started with.
    r = subprocess.run(command("--resume", str(run_dir)), capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "network-snapshot-000001.pkl" in r.stdout

    ref = by_hand(data, str(tmp_path / "by_hand"))
    got = dict(tensors_of(ganc.load_checkpoint(str(run_dir / "checkpoint.pt"))))
    want = dict(tensors_of(ganc.load_checkpoint(os.path.join(ref, "checkpoint.pt"))))
    assert got.keys() == want.keys()
    differing = [k for k in want if not torch.equal(got[k], want[k])]
    assert not differing, f"{len(differing)} tensors differ from the recipe trained by hand, e.g. {differing[:3]}"

    # The last pickle: what StyleGAN's training loop pickles, with the run's final weights.
    final = ganc.load_checkpoint(str(run_dir / "checkpoint.pt"))
    with open(run_dir / "network-snapshot-000001.pkl", "rb") as f:
        snap = pickle.load(f)
    assert sorted(snap) == ["D", "G", "G_ema", "augment_pipe", "training_set_kwargs"]
    assert snap["training_set_kwargs"] == {"class_name": "training.dataset.ImageFolderDataset", "path": data,
                                           "use_labels": False, "max_size": 256, "xflip": True, "resolution": SIZE}
    for name in ("G", "D", "G_ema"):
        state = snap[name].state_dict()
        assert state.keys() == final[name].keys()
        assert all(torch.equal(state[k], final[name][k]) for k in state), name
    p = final["controllers"]["augment_p"]["value"]
    assert float(snap["augment_pipe"].p) == float(p) and float(p) > 0  # ADA moved p
    assert snap["G_ema"](torch.randn(2, 512), None).shape == (2, 3, SIZE, SIZE)


def test_resume_from_a_network_pickle_takes_its_weights(tmp_path):
    """train.py's --resume PKL: G, D and G_ema start from the pickle's parameters and buffers."""
    from zoo.stylegan2_ada import Discriminator, Generator
    data = dataset_zip(str(tmp_path / "digits16.zip"), count=8)
    args = stylegan.parser().parse_args(["--outdir", str(tmp_path), "--data", data, *COMMAND, "--fp32", "1"])
    info = stylegan.read_dataset(data, False)
    _, _, _, G0, D0, _, _ = stylegan.build(args, info, Generator, Discriminator, None)
    torch.manual_seed(7)
    source = {"G": copy.deepcopy(G0), "D": copy.deepcopy(D0), "G_ema": copy.deepcopy(G0)}
    with torch.no_grad():
        for module in source.values():
            for t in module.parameters():
                t.normal_()
    with open(tmp_path / "source.pkl", "wb") as f:
        pickle.dump(source, f)
    args.resume = str(tmp_path / "source.pkl")
    gan, _, _, G, D, _, _ = stylegan.build(args, info, Generator, Discriminator, None)
    for name, module in (("G", G), ("D", D), ("G_ema", gan.G_ema)):
        theirs = source[name].state_dict()
        assert all(torch.equal(v, theirs[k]) for k, v in module.state_dict().items()), name
    assert not torch.equal(next(G.parameters()), next(G0.parameters()))


@pytest.mark.parametrize("args,says", [
    (["--aug", "fixed"], "--aug=fixed requires specifying --p"),
    (["--batch", "7"], "--batch must be at least 1 and divisible by --gpus"),
    (["--networks", "no_such_module_anywhere"], "--networks no_such_module_anywhere: importing"),
    (["--data", "/no/such.zip"], "--data /no/such.zip: no such file or folder"),
    (["--cond", "1", "--data", "unlabelled"], "--cond 1 needs the labels of a dataset.json"),
    (["--metrics", "fid50k_full", "--inception", "/no/inception.pt"],
     "--metrics fid50k_full: the Inception network /no/inception.pt is missing"),
])
def test_bad_options_are_refused_in_one_line_before_anything_is_written(tmp_path, args, says):
    data = dataset_zip(str(tmp_path / "digits16.zip"), count=8)
    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    with zipfile.ZipFile(data) as z:
        (unlabelled / "a.png").write_bytes(z.read("00000/img00000000.png"))
    given = dict(zip(COMMAND[::2], COMMAND[1::2]))
    given["--data"] = data
    for flag, value in zip(args[::2], args[1::2]):
        given[flag] = str(unlabelled) if value == "unlabelled" else value
    r = subprocess.run(command("--outdir", str(tmp_path / "runs"), *[x for kv in given.items() for x in kv]),
                       capture_output=True, text=True, env=ENV)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_run_directory_continues_with_its_own_options_only(tmp_path):
    run = tmp_path / "00000-x"
    run.mkdir()
    r = subprocess.run(command("--resume", str(run), "--kimg", "5"), capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and "continues with the options it started with; drop --kimg" in r.stderr, r.stderr
    r = subprocess.run(command("--resume", str(run)), capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and "not a run directory of ganc stylegan" in r.stderr, r.stderr
