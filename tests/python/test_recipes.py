"""ganc.recipes: StyleGAN2's loss with stylegan2-ada-pytorch's train.py presets. Each preset's
numbers are those train.py sets (tests/python/data/stylegan2_ada_presets.json, recorded from
its `--dry-run` by bench/stylegan2_ada_presets.py), and the recipe around the zoo's
StyleGAN2-ADA-style networks trains at 2 ranks bit for bit like eager DDP on its archive,
EMA ramp-up included."""
import copy
import functools
import json
import os
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ganc
from ganc import recipes, reference
from conftest import gradient_dumps

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDED = json.load(open(os.path.join(HERE, "data", "stylegan2_ada_presets.json")))
STEPS = 17  # Dreg (every 16) twice, Greg (every 4) five times


def subset(small, big, where=""):
    """Every key of `small` is in `big` with the same value (dicts compared key by key)."""
    for key, value in small.items():
        assert key in big, f"{where}{key}: not set by train.py"
        if isinstance(value, dict):
            subset(value, big[key], f"{where}{key}.")
        else:
            assert value == big[key], f"{where}{key}: ganc {value!r}, train.py {big[key]!r}"


def gradients_equal_eager_ddp(ganc_bin, model, plan, spec, data, steps, seed, tmp_path, reducer=None):
    """Compiles `model`, trains it at 2 ranks for `steps` steps and asserts every phase's
    all-reduced gradients equal eager DDP's on the archive bit for bit (`reducer`: the
    reference's per phase, as reference.run takes it)."""
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    run = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", data, "--steps",
                          str(steps), "--seed", str(seed), "--out", str(tmp_path / "train"), "--sample-every", "0",
                          "--checkpoint-every", "0", "--dump-grads", str(tmp_path / "dump")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    reference.run(model, data, 2, steps, seed, str(tmp_path / "ddp"), **({"reducer": reducer} if reducer else {}))
    for step, phase, got, ref in gradient_dumps(spec, steps, str(tmp_path / "dump"), str(tmp_path / "ddp")):
        assert all(torch.equal(got[name], ref[name]) for name in ref), (step, phase)


def case_id(c):
    return f"{c['cfg']}-{c['resolution']}px-{c['gpus']}gpu" + (f"-batch{c['batch']}" if c.get("batch") else "")


def batch_of(case) -> dict:
    """train.py's --batch of a recorded case, as a preset override."""
    return {"batch": case["batch"]} if case.get("batch") else {}


@pytest.mark.parametrize("case", RECORDED["cases"], ids=case_id)
def test_each_preset_is_what_train_py_sets(case):
    """Every number of each preset, and of each with train.py's --batch (each GPU then takes
    batch // gpus: a batch of 16 on 2 GPUs was split into 2 images per GPU and 4 rounds)."""
    o = case["options"]
    p = recipes.preset(case["cfg"], case["resolution"], case["gpus"], **batch_of(case))
    loss = {**RECORDED["defaults"]["loss"], **o["loss_kwargs"]}
    assert (p.batch, p.batch_gpu, p.kimg, p.ema_kimg, p.ema_rampup) == (
        o["batch_size"], o["batch_gpu"], o["total_kimg"], o["ema_kimg"], o["ema_rampup"])
    assert p.gamma == loss["r1_gamma"]
    for mine, theirs in ((p.style_mixing_prob, "style_mixing_prob"), (p.pl_weight, "pl_weight"),
                         (p.pl_batch_shrink, "pl_batch_shrink"), (p.pl_decay, "pl_decay")):
        assert mine == loss[theirs], theirs
    assert (p.g_reg_interval, p.d_reg_interval) == (RECORDED["defaults"]["G_reg_interval"],
                                                    RECORDED["defaults"]["D_reg_interval"])
    for opt in (o["G_opt_kwargs"], o["D_opt_kwargs"]):
        assert (p.lr, list(p.betas), p.eps) == (opt["lr"], opt["betas"], opt["eps"])
    kwargs = p.network_kwargs()
    subset(kwargs["G"], o["G_kwargs"], "G_kwargs.")
    subset(kwargs["D"], o["D_kwargs"], "D_kwargs.")
    assert ("architecture" in kwargs["D"]) == ("architecture" in o["D_kwargs"])


class Stub(nn.Module):
    """A generator's interface, to see the spec a recipe writes."""

    def __init__(self, resolution, c_dim=0):
        super().__init__()
        self.z_dim, self.c_dim, self.img_resolution, self.img_channels = 512, c_dim, resolution, 3
        self.lin = nn.Linear(1, 1)


@pytest.mark.parametrize("case", [c for c in RECORDED["cases"] if c["cfg"] in ("paper256", "cifar")], ids=case_id)
def test_the_spec_scales_the_optimizers_as_training_loop_does(case):
    """training_loop's lazy regularisation: a network regularised every k steps takes
    lr * k/(k+1) and betas ** (k/(k+1)); a preset without path length or R1 has no such phase.
    Each GPU takes train.py's batch_gpu per pass, the rest of the batch accumulated."""
    o = case["options"]
    gan, spec = recipes.stylegan2(Stub(case["resolution"]), Stub(case["resolution"]), cfg=case["cfg"],
                                  gpus=case["gpus"], **batch_of(case))
    loss = {**RECORDED["defaults"]["loss"], **o["loss_kwargs"]}
    intervals = {"G": RECORDED["defaults"]["G_reg_interval"] if loss["pl_weight"] else 0,
                 "D": RECORDED["defaults"]["D_reg_interval"] if loss["r1_gamma"] else 0}
    for name, k in intervals.items():
        ratio = k / (k + 1) if k else 1.0
        theirs = o[f"{name}_opt_kwargs"]
        assert spec["optimizers"][name]["lr"] == theirs["lr"] * ratio
        assert spec["optimizers"][name]["betas"] == [b ** ratio for b in theirs["betas"]]
    phases = {p["name"]: p for p in spec["phases"]}
    assert ("Greg" in phases) == bool(loss["pl_weight"]) and "Dreg" in phases
    assert spec["batch_size"] * case["gpus"] * phases["Dmain"].get("accumulate", 1) == o["batch_size"]
    assert spec["batch_size"] == o["batch_gpu"]
    assert spec["ema"]["half_life_images"] == o["ema_kimg"] * 1000
    assert spec["ema"].get("rampup") == o["ema_rampup"]


def test_bad_presets_are_refused_in_one_line():
    with pytest.raises(ValueError, match="no StyleGAN2 preset 'paper128'"):
        recipes.preset("paper128", 128)
    with pytest.raises(ValueError, match="resolution a power of two"):
        recipes.preset("auto", 100)
    with pytest.raises(ValueError, match="no setting 'lrate'"):
        recipes.preset("auto", 64, lrate=0.1)
    # Values that once trained something else without a word: batch 0 or -8 became 1, gamma -1
    # or NaN dropped the R1 phase.
    for bad, words in ((dict(batch=0), "batch is an integer >= 1, not 0"),
                       (dict(batch=-8), "batch is an integer >= 1, not -8"),
                       (dict(gamma=-1), "gamma is a finite number >= 0, not -1"),
                       (dict(gamma=float("nan")), "gamma is a finite number >= 0, not nan"),
                       (dict(lr=0), "lr is a finite number > 0, not 0"),
                       (dict(style_mixing_prob=2), r"style_mixing_prob is a probability in \[0, 1\], not 2"),
                       (dict(betas=(0.0, 1.5)), r"betas are two numbers in \[0, 1\), not \(0.0, 1.5\)")):
        with pytest.raises(ValueError, match=words):
            recipes.preset("paper256", 256, **bad)
    with pytest.raises(ValueError, match=r"a batch of 15 does not divide over 2 GPUs \(train.py: --batch must be "
                                         "at least 1 and divisible by --gpus\)"):
        recipes.preset("paper256", 256, 2, batch=15)
    with pytest.raises(ValueError, match=r"gamma must be >= 0 and batch_gpu >= 1 \(got nan, 4\)"):
        recipes.r3gan(nn.Linear(1, 1), nn.Linear(1, 1), gamma=float("nan"), batch_gpu=4)


def zoo_recipe(seed, **overrides):
    """(gan, spec): the recipe around the zoo's StyleGAN2-ADA-style G and D (NVIDIA's signatures)
    at 16 pixels, their weights drawn after seeding `seed`, in the 'auto' preset for 2 GPUs at
    batch 8 with `overrides`."""
    from zoo.stylegan2_ada import Discriminator, Generator
    torch.manual_seed(seed)
    G = Generator(z_dim=32, c_dim=0, w_dim=32, img_resolution=16, img_channels=3,
                  mapping_kwargs=dict(num_layers=2), synthesis_kwargs=dict(channel_base=512, channel_max=32))
    D = Discriminator(c_dim=0, img_resolution=16, img_channels=3, channel_base=512, channel_max=32)
    return recipes.stylegan2(G, D, cfg="auto", gpus=2, batch=8, **overrides)


def eager_recipe(seed, **overrides):
    """The recipe's module, for the eager DDP reference: the Python code a user's eager run
    executes (their autograd Functions' own backward), which ganc's joint graphs hold; the
    archive's code derives those gradients from the forwards, last bits apart in float32."""
    return zoo_recipe(seed, **overrides)[0]


def style_mixing_gan(seed):
    gan, _ = zoo_recipe(seed, gamma=1.0)
    return NvidiaStyleMixing(gan.G, gan.D, recipes.preset("auto", 16, 2, batch=8, gamma=1.0))


def test_bad_recipe_arguments_are_refused_in_one_line():
    """ada_target 5 or -1 was accepted, batch_gpu=0 taken as unset, and 'bgcf' at 16 px ended
    in PyTorch's raw "Padding size should be less than ..." at export."""
    from zoo.stylegan2_ada import Discriminator, Generator
    G = Generator(z_dim=32, c_dim=0, w_dim=32, img_resolution=16, img_channels=3,
                  mapping_kwargs=dict(num_layers=2), synthesis_kwargs=dict(channel_base=512, channel_max=32))
    D = Discriminator(c_dim=0, img_resolution=16, img_channels=3, channel_base=512, channel_max=32)
    for bad, words in ((dict(augment="bgc", ada_target=5), "ada_target is the mean sign .* not 5"),
                       (dict(augment="bgc", ada_target=-1), "ada_target is the mean sign .* not -1"),
                       (dict(batch_gpu=0), "batch_gpu is the images each GPU takes per pass, an integer >= 1"),
                       (dict(augment="bgc", augment_p=float("nan")), r"augment_p is in \[0, 1\]"),
                       (dict(augment="bgcf"), "augment 'bgcf': its image filter pads each image by 21 pixels by "
                                              "reflection, which needs images larger than that \\(G makes 16 pixels\\)")):
        with pytest.raises(ValueError, match=words):
            recipes.stylegan2(G, D, cfg="auto", gpus=2, batch=8, **bad)


def test_the_recipe_trains_like_eager_ddp(ganc_bin, digits16, tmp_path):
    """The zoo's StyleGAN2-ADA-style G and D (NVIDIA's signatures) in the 'auto' preset at 16
    pixels, its batch and gamma overridden to fit the machine: exported, compiled and trained
    at 2 ranks for 17 steps, every phase's gradients, the final parameters and G_ema (ramped
    up) equal eager DDP on the recipe's Python module bit for bit (--fusion off: the reference
    runs the module's reference resampling)."""
    from zoo.stylegan2_ada import Discriminator, Generator
    gan, spec = zoo_recipe(0, gamma=1.0, ema_kimg=0.1)
    G, D = gan.G, gan.D
    assert spec["ema"] == {"submodule": "G", "copy": "G_ema", "half_life_images": 100.0, "rampup": 0.05}
    model, plan = str(tmp_path / "sg2.pt"), str(tmp_path / "sg2.plan")
    ganc.export(gan, model, spec)
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    run = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", digits16, "--steps",
                          str(STEPS), "--seed", "3", "--out", str(tmp_path / "train"), "--sample-every", "0",
                          "--checkpoint-every", str(STEPS), "--fusion", "off", "--dump-grads", str(tmp_path / "dump")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    reference.run(model, digits16, 2, STEPS, 3, str(tmp_path / "ddp"), reducer={"Dreg": "manual", "Greg": "manual"},
                  eager_model=functools.partial(eager_recipe, 0, gamma=1.0, ema_kimg=0.1))
    phases = set()
    for step, phase, got, ref in gradient_dumps(spec, STEPS, str(tmp_path / "dump"), str(tmp_path / "ddp")):
        phases.add(phase)
        assert all(torch.equal(got[name], ref[name]) for name in ref), (step, phase)
    assert phases == {"Gmain", "Greg", "Dmain", "Dreg"}
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    assert any(name.startswith("G_ema.") for name in ref)
    assert set(got) == set(ref) and all(torch.equal(got[name], ref[name]) for name in ref)

    # StyleGAN's network pickle of the run, with the zoo's own classes: it loads through pickle
    # and holds the trained G_ema (17 steps of 16 images: 0 kimg).
    fresh = dict(G=G, D=D, G_ema=gan.G_ema)
    path = ganc.stylegan_snapshot(str(tmp_path / "train" / "checkpoint.pt"), str(tmp_path / "snapshots"), **fresh)
    assert os.path.basename(path) == "network-snapshot-000000.pkl"
    import pickle
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert type(snapshot["G_ema"]) is Generator and not snapshot["G_ema"].training
    assert all(torch.equal(t, ref["G_ema." + n]) for n, t in snapshot["G_ema"].state_dict().items())
    assert snapshot["G_ema"](torch.randn(2, 32), None).shape == (2, 3, 16, 16)
    with pytest.raises(ValueError, match="holds no submodule 'mapping'"):
        ganc.stylegan_snapshot(str(tmp_path / "train" / "checkpoint.pt"), str(tmp_path / "snapshots"), mapping=G)
    # No networks (it pickled an empty snapshot), a network of another shape (a raw
    # load_state_dict error): one line each, and no .pkl.tmp left behind.
    with pytest.raises(ValueError, match="give the networks to pickle by the GAN's submodule names"):
        ganc.stylegan_snapshot(str(tmp_path / "train" / "checkpoint.pt"), str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"^ganc.stylegan_snapshot: D \(Linear\) does not take the checkpoint's 'D': "):
        ganc.stylegan_snapshot(str(tmp_path / "train" / "checkpoint.pt"), str(tmp_path / "snapshots"), D=nn.Linear(1, 1))
    assert not list((tmp_path / "snapshots").glob("*.tmp"))

    # The sample grid: G_ema(z) where c has a default (the zoo's G); else G_ema(z, c) through
    # the loss's method (NVIDIA's G takes c without one), drawn by a one-step run; a
    # conditional G's grid cycles the classes.
    assert spec["sample"] == {"submodule": "G_ema", "noise_shape": [32]}

    class NoDefaultC(Generator):
        def forward(self, z, c, truncation_psi: float = 1.0):
            return super().forward(z, c, truncation_psi=truncation_psi)

    torch.manual_seed(0)
    Gn = NoDefaultC(z_dim=32, c_dim=0, w_dim=32, img_resolution=16, img_channels=3,
                    mapping_kwargs=dict(num_layers=2), synthesis_kwargs=dict(channel_base=512, channel_max=32))
    gan_n, spec_n = recipes.stylegan2(Gn, D, cfg="auto", gpus=1, batch=8, gamma=1.0)
    assert spec_n["sample"] == {"method": "sample_grid", "inputs": [{"name": "z", "source": "normal", "shape": [32]}]}
    model_n, plan_n = str(tmp_path / "nodefault.pt"), str(tmp_path / "nodefault.plan")
    ganc.export(gan_n, model_n, spec_n, verbose=False)
    subprocess.run([ganc_bin, "compile", model_n, "-o", plan_n], check=True, capture_output=True)
    grid = subprocess.run([ganc_bin, "train", plan_n, "--model", model_n, "--data", digits16, "--steps", "1", "--out",
                           str(tmp_path / "grid"), "--sample-every", "1", "--fusion", "off"],
                          capture_output=True, text=True, timeout=600)
    assert grid.returncode == 0, grid.stderr
    from PIL import Image
    pixels = torch.tensor(list(Image.open(tmp_path / "grid" / "samples.png").convert("L").getdata()), dtype=torch.float)
    assert pixels.numel() >= 16 * 16 * 4 and pixels.std() > 0
    Gc = Generator(z_dim=32, c_dim=10, w_dim=32, img_resolution=16, img_channels=3,
                   mapping_kwargs=dict(num_layers=2), synthesis_kwargs=dict(channel_base=512, channel_max=32))
    _, conditional = recipes.stylegan2(Gc, Discriminator(c_dim=10, img_resolution=16, img_channels=3,
                                                         channel_base=512, channel_max=32), cfg="auto", gpus=2, batch=8)
    assert conditional["sample"]["method"] == "sample_grid_c"
    assert [i["source"] for i in conditional["sample"]["inputs"]] == ["normal", "categorical"]


class TinyG(nn.Module):
    """A generator with R3GAN's signature, G(z, c)."""

    def __init__(self):
        super().__init__()
        self.z_dim, self.c_dim, self.img_resolution, self.img_channels = 8, 0, 16, 3
        self.fc = nn.Linear(8, 16 * 4 * 4)
        self.conv = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, z, c):
        x = self.fc(z).view(-1, 16, 4, 4)
        return torch.tanh(self.conv(nn.functional.interpolate(x, scale_factor=4.0)))


class TinyD(nn.Module):
    """A discriminator with R3GAN's signature, D(img, c)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 4, stride=4)
        self.fc = nn.Linear(8 * 4 * 4, 1)

    def forward(self, img, c):
        return self.fc(nn.functional.leaky_relu(self.conv(img), 0.2).flatten(1)).squeeze(1)


def test_r3gans_loss_trains_like_eager_ddp(ganc_bin, digits16, tmp_path):
    """RpGAN with R1 and R2 every D step (a double backward in the D phase), at 2 ranks: every
    phase's gradients and the final parameters equal eager DDP on the archive bit for bit."""
    torch.manual_seed(0)
    gan, spec = recipes.r3gan(TinyG(), TinyD(), gamma=2.0, batch_gpu=4)
    assert [p["name"] for p in spec["phases"]] == ["D", "G"] and spec["optimizers"]["D"]["betas"] == [0.0, 0.9]
    model, plan = str(tmp_path / "r3.pt"), str(tmp_path / "r3.plan")
    ganc.export(gan, model, spec)
    gradients_equal_eager_ddp(ganc_bin, model, plan, spec, digits16, 6, 3, tmp_path)
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    assert set(got) == set(ref) and all(torch.equal(got[name], ref[name]) for name in ref)


class NvidiaStyleMixing(recipes.StyleGAN2Loss):
    """StyleGAN2Loss.run_G's style mixing as NVIDIA writes it: the cutoff a 0-dim tensor, the
    mixed styles assigned in place into a slice, both mapping calls with a keyword (the
    stylegan3 repository's run_G)."""

    def run_g(self, z: torch.Tensor, c: torch.Tensor, update_emas: bool = False):
        ws = self.G.mapping(z, c, update_emas=update_emas)
        cutoff = torch.empty([], dtype=torch.int64, device=ws.device).random_(1, ws.shape[1])
        cutoff = torch.where(torch.rand([], device=ws.device) < self.style_mixing_prob, cutoff,
                             torch.full_like(cutoff, ws.shape[1]))
        ws[:, cutoff:] = self.G.mapping(torch.randn_like(z), c, update_emas=False)[:, cutoff:]
        return self.G.synthesis(ws), ws


class AdaMapping(nn.Module):
    """stylegan2-ada-pytorch's MappingNetwork as its loss sees it: w_avg moves in every call in
    training mode unless the call passes skip_w_avg_update=True."""

    def __init__(self, z_dim=8, w_dim=8, num_ws=4, w_avg_beta=0.5, c_dim=0):
        super().__init__()
        self.num_ws, self.w_avg_beta = num_ws, w_avg_beta
        self.fc = nn.Linear(z_dim, w_dim)
        self.embed = nn.Linear(c_dim, w_dim) if c_dim else None
        self.register_buffer("w_avg", torch.zeros([w_dim]))

    def forward(self, z, c, truncation_psi=1, truncation_cutoff=None, skip_w_avg_update=False):
        x = self.fc(z) if self.embed is None else self.fc(z) + self.embed(c)
        x = F.leaky_relu(x, 0.2)
        if self.w_avg_beta is not None and self.training and not skip_w_avg_update:
            self.w_avg.copy_(x.detach().mean(dim=0).lerp(self.w_avg, self.w_avg_beta))
        return x.unsqueeze(1).repeat([1, self.num_ws, 1])


class AdaSynthesis(nn.Module):
    def __init__(self, w_dim=8, num_ws=4):
        super().__init__()
        self.fc = nn.Linear(w_dim * num_ws, 3 * 16 * 16)

    def forward(self, ws):
        return torch.tanh(self.fc(ws.flatten(1))).view(-1, 3, 16, 16)


class AdaG(nn.Module):
    """G(z, c) = synthesis(mapping(z, c)), with stylegan2-ada-pytorch's mapping signature."""

    def __init__(self, c_dim=0):
        super().__init__()
        self.z_dim, self.c_dim, self.w_dim, self.num_ws, self.img_resolution, self.img_channels = 8, c_dim, 8, 4, 16, 3
        self.mapping, self.synthesis = AdaMapping(c_dim=c_dim), AdaSynthesis()

    def forward(self, z, c, **kwargs):
        return self.synthesis(self.mapping(z, c, **kwargs))


def nvidia_run_g_ws(G, z, c, style_mixing_prob, api, update_emas):
    """The styles of NVIDIA's run_G, as stylegan2-ada-pytorch (api 'skip') and the stylegan3
    repository (api 'emas') write it: the mapping call, then style mixing's second call."""
    ws = G.mapping(z, c, update_emas=update_emas) if api == "emas" else G.mapping(z, c)
    cutoff = torch.empty([], dtype=torch.int64).random_(1, ws.shape[1])
    cutoff = torch.where(torch.rand([]) < style_mixing_prob, cutoff, torch.full_like(cutoff, ws.shape[1]))
    kwargs = {"update_emas": False} if api == "emas" else {"skip_w_avg_update": True}
    ws[:, cutoff:] = G.mapping(torch.randn_like(z), c, **kwargs)[:, cutoff:]
    return ws


def test_w_avg_moves_where_nvidias_loss_moves_it():
    """The truncation centre w_avg after each phase equals NVIDIA's loss's, bit for bit: with
    stylegan2-ada-pytorch's mapping it moves once per generator run (the style mixing call
    passes skip_w_avg_update=True; it moved twice, drifting from train.py's); with the
    stylegan3 repository's it moves only in Dmain's generator run (update_emas=True; it never
    moved)."""
    from zoo.stylegan2_ada import Discriminator, Generator
    torch.manual_seed(0)
    z, real = torch.randn(4, 8), torch.randn(4, 3, 16, 16)
    for api, make_g in (("skip", AdaG), ("emas", lambda: Generator(z_dim=8, c_dim=0, w_dim=8, img_resolution=16,
                                                                   img_channels=3, mapping_kwargs=dict(num_layers=1),
                                                                   synthesis_kwargs=dict(channel_base=64,
                                                                                         channel_max=8)))):
        G = make_g().train()
        D = Discriminator(c_dim=0, img_resolution=16, img_channels=3, channel_base=64, channel_max=8)
        loss = recipes.StyleGAN2Loss(G, D, recipes.preset("auto", 16, 1, batch=4, gamma=1.0))
        assert loss.style_mixing_prob > 0
        oracle = copy.deepcopy(G)
        c = torch.zeros([4, 0])
        for phase, update_emas in (("gmain", False), ("dmain", True)):
            before = G.mapping.w_avg.clone()
            loss.phase_gmain(z) if phase == "gmain" else loss.phase_dmain(real, z)
            nvidia_run_g_ws(oracle, z, c, loss.style_mixing_prob, api, update_emas)
            assert torch.equal(G.mapping.w_avg, oracle.mapping.w_avg), (api, phase)
            moved = not torch.equal(G.mapping.w_avg, before)
            assert moved == (api == "skip" or update_emas), (api, phase)


def test_the_style_mixing_call_of_stylegan2_ada_pytorch_s_mapping_trains_like_eager_ddp(ganc_bin, digits16,
                                                                                         tmp_path):
    """The recipe around a G with stylegan2-ada-pytorch's mapping signature (its style mixing call
    passes skip_w_avg_update=True) exports and trains at 2 ranks bit for bit like eager DDP."""
    torch.manual_seed(0)
    gan, spec = recipes.stylegan2(AdaG(), TinyD(), cfg="auto", gpus=2, batch=8, gamma=1.0)
    model, plan = str(tmp_path / "ada.pt"), str(tmp_path / "ada.plan")
    ganc.export(gan, model, spec)
    gradients_equal_eager_ddp(ganc_bin, model, plan, spec, digits16, 4, 3, tmp_path,
                              reducer={"Dreg": "manual", "Greg": "manual"})
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    assert set(got) == set(ref) and all(torch.equal(got[name], ref[name]) for name in ref)


def test_style_mixing_as_nvidia_writes_it_trains_like_eager_ddp(ganc_bin, digits16, tmp_path):
    """In-place slice assignment of a phase's tensors (at a tensor-valued cutoff) and a keyword
    into the traced mapping network go through: 6 steps at 2 ranks bit for bit like eager DDP
    on the archive, every phase through the archive's code (the cutoff decides what runs, so
    the generator's phases have no joint graph)."""
    _, spec = zoo_recipe(1, gamma=1.0)
    gan = style_mixing_gan(1)
    model, plan = str(tmp_path / "mix.pt"), str(tmp_path / "mix.plan")
    ganc.export(gan, model, spec)
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    run = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", digits16, "--steps", "6",
                          "--seed", "3", "--out", str(tmp_path / "train"), "--sample-every", "0",
                          "--checkpoint-every", "0", "--fusion", "off", "--executor", "torchscript",
                          "--dump-grads", str(tmp_path / "dump")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    reference.run(model, digits16, 2, 6, 3, str(tmp_path / "ddp"), reducer={"Dreg": "manual", "Greg": "manual"})
    for step, phase, got, ref in gradient_dumps(spec, 6, str(tmp_path / "dump"), str(tmp_path / "ddp")):
        assert all(torch.equal(got[name], ref[name]) for name in ref), (step, phase)
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    assert set(got) == set(ref) and all(torch.equal(got[name], ref[name]) for name in ref)


def test_augmentation_scripts_and_differentiates_twice():
    """ganc.augment's pipes script as they are (bit for bit like the Python module at the same
    seed), every pipe changes images at p = 1 and none at p = 0 apart from the geometric
    resampling's rounding, and the pipe's first and second derivatives with respect to the
    images (all but the filter bank's plain convolutions) are exact (float64 gradcheck and
    gradgradcheck: R1 through the augmentation)."""
    from ganc import augment
    torch.manual_seed(0)
    images = torch.randn(3, 3, 24, 24)  # the filter bank's 43 taps reflect-pad by 21
    for name, settings in augment.PIPES.items():
        eager = augment.AugmentPipe(**settings)
        scripted = torch.jit.script(eager)
        for p in (0.0, 1.0):
            torch.manual_seed(5)
            a = eager(images, torch.tensor(p))
            torch.manual_seed(5)
            assert torch.equal(a, scripted(images, torch.tensor(p))), name
            moved = (a - images).abs().max().item()
            assert (moved > 0.05) if p else (moved < 1e-5), (name, p, moved)
    pipe = augment.AugmentPipe(**augment.PIPES["bgc"], noise=1, cutout=1).double()
    x = torch.randn(1, 3, 5, 5, dtype=torch.float64, requires_grad=True)

    def run(x):
        torch.manual_seed(7)
        return pipe(x, torch.tensor(0.8, dtype=torch.float64))
    assert torch.autograd.gradcheck(run, (x,)) and torch.autograd.gradgradcheck(run, (x,))
    with pytest.raises(ValueError, match="imgfilter_bands has 4 entries"):
        augment.AugmentPipe(imgfilter=1, imgfilter_bands=[1, 1])


def test_nvidias_augment_pipe_is_taken_with_its_settings_and_p(capsys):
    """A module with NVIDIA's AugmentPipe's attributes (their training/augment.py's names) and
    buffers becomes ganc's pipe with the same settings and p, and the recipe says so in the
    line the export writes when it replaces their pipe; another module is refused in one line;
    a fixed p (ada_target=None) goes into the pipe and the spec has no controller."""
    from zoo.stylegan2_ada import Discriminator, Generator
    from ganc import augment
    theirs = augment.AugmentPipe(**augment.PIPES["bgc"], xint_max=0.25, hue_max=0.5)
    theirs.p.fill_(0.3)
    theirs.__class__ = type("AugmentPipe", (nn.Module,), {})  # not ganc's class: taken by its attributes
    ours = recipes._augment_pipe(theirs)
    assert type(ours) is augment.AugmentPipe and ours.p.item() == pytest.approx(0.3)
    assert capsys.readouterr().out == f"ganc.recipes: augment_pipe: replaced ({augment.REPLACED})\n"
    assert ours.xint_max == 0.25 and ours.hue_max == 0.5 and ours.rotate == 1.0 and ours.imgfilter == 0.0
    with pytest.raises(ValueError, match="ganc.augment: Linear is not an AugmentPipe: it has no 'xflip'"):
        recipes._augment_pipe(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no augmentation pipe 'bgx'"):
        recipes._augment_pipe("bgx")
    # Settings that once gave NaN images (noise_std=inf), no augmentation (p NaN) or Python's
    # own TypeError: one line naming the setting.
    for bad, words in ((dict(noise_std=float("inf")), "noise_std is a finite number >= 0, not inf"),
                       (dict(xflip="often"), "xflip is a finite number >= 0, not 'often'"),
                       (dict(rotate=-1), "rotate is a finite number >= 0, not -1")):
        with pytest.raises(ValueError, match=words):
            augment.AugmentPipe(**{**augment.PIPES["bgc"], **bad})
    nan_p = augment.AugmentPipe(**augment.PIPES["bgc"])
    nan_p.p.fill_(float("nan"))
    nan_p.__class__ = type("AugmentPipe", (nn.Module,), {})
    with pytest.raises(ValueError, match=r"AugmentPipe.p is a probability in \[0, 1\], not nan"):
        recipes._augment_pipe(nan_p)
    G = Generator(z_dim=32, c_dim=0, w_dim=32, img_resolution=16, img_channels=3,
                  mapping_kwargs=dict(num_layers=2), synthesis_kwargs=dict(channel_base=512, channel_max=32))
    D = Discriminator(c_dim=0, img_resolution=16, img_channels=3, channel_base=512, channel_max=32)
    gan, spec = recipes.stylegan2(G, D, cfg="auto", gpus=2, batch=8, augment="bgc", augment_p=0.25, ada_target=None)
    assert "controllers" not in spec and gan.augment_pipe.p.item() == 0.25
    assert [phase["method"] for phase in spec["phases"]] == ["phase_gmain", "phase_greg", "phase_dmain", "phase_dreg"]


def test_ada_counts_the_real_logits_of_dmain_and_of_r1():
    """StyleGAN2-ADA's loop reports the signs of D's real logits in Dmain and in R1's pass (Dreg)
    alike (both report Loss/signs/real) and moves p by their mean: the recipe's controller reads
    both phases (it read Dmain's only), and Dreg logs the mean sign of the very logits its R1
    differentiates. Without R1 (gamma 0) there is no Dreg to read."""
    torch.manual_seed(0)
    gan, spec = recipes.stylegan2(AdaG(), TinyD(), cfg="auto", gpus=1, batch=4, gamma=1.0, augment="bgc",
                                  augment_p=0.3)
    assert spec["controllers"]["augment_p"]["phases"] == ["Dmain", "Dreg"]
    real, p = torch.randn(4, 3, 16, 16), torch.tensor(0.3)
    torch.manual_seed(5)
    logits = gan.run_d(real, torch.zeros([4, 0]), p)  # NVIDIA's Dr1: D(augment(real)), the same draws
    torch.manual_seed(5)
    penalty, logged = gan.phase_dreg_a(real, p)
    assert penalty.dim() == 0 and torch.equal(logged["signs_real"], logits.sign().mean())
    _, no_r1 = recipes.stylegan2(AdaG(), TinyD(), cfg="auto", gpus=1, batch=4, gamma=0.0, augment="bgc")
    assert no_r1["controllers"]["augment_p"]["phases"] == ["Dmain"]


def test_ada_with_the_full_pipe_trains_like_eager_ddp(ganc_bin, digits16, tmp_path):
    """The zoo's StyleGAN2-ADA-style networks with ADA on train.py's default pipe (bgc): every
    phase that calls D sees the augmented images, p adjusted every 4 steps from the mean sign
    of D's real logits in Dmain and in R1's Dreg. 9 steps at 2 ranks (R1 through the augmentation at steps 0 and 8):
    every gradient, the final parameters and p after every step equal eager DDP's on the
    Python module bit for bit, and p moved."""
    ada = dict(gamma=1.0, d_reg_interval=8, augment="bgc", augment_p=0.5, ada_kimg=0.1)
    gan, spec = zoo_recipe(2, **ada)
    assert spec["controllers"]["augment_p"] == {"type": "ada", "phases": ["Dmain", "Dreg"], "statistic": "signs_real",
                                                "target": 0.6, "interval": 4, "speed_kimg": 0.1, "initial": 0.5}
    assert [phase["method"] for phase in spec["phases"]] == ["phase_gmain_a", "phase_greg", "phase_dmain_a",
                                                             "phase_dreg_a"]
    model, plan, steps = str(tmp_path / "ada.pt"), str(tmp_path / "ada.plan"), 9
    ganc.export(gan, model, spec, verbose=False)
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    run = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", digits16, "--steps",
                          str(steps), "--seed", "4", "--out", str(tmp_path / "train"), "--sample-every", "0",
                          "--log-every", "1", "--checkpoint-every", str(steps), "--fusion", "off", "--dump-grads",
                          str(tmp_path / "dump")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    ref_dir = str(tmp_path / "ddp")
    reference.run(model, digits16, 2, steps, 4, ref_dir, reducer={"Dreg": "manual", "Greg": "manual"},
                  eager_model=functools.partial(eager_recipe, 2, **ada))
    for step, phase, got, ref in gradient_dumps(spec, steps, str(tmp_path / "dump"), ref_dir):
        assert all(torch.equal(got[name], ref[name]) for name in ref), (step, phase)
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(os.path.join(ref_dir, "params_final.pt"))
    assert set(got) == set(ref) and all(torch.equal(got[name], ref[name]) for name in ref)
    with open(os.path.join(ref_dir, "controllers.json")) as f:
        expected = json.load(f)["augment_p"]
    with open(tmp_path / "train" / "stats.jsonl") as f:
        p = [json.loads(line)["Controller/augment_p"] for line in f]
    assert p == pytest.approx(expected, rel=0, abs=1e-7) and len(set(p)) > 1, (p, expected)
    # StyleGAN's network pickle holds the pipe with the p ADA reached.
    from ganc import augment
    path = ganc.stylegan_snapshot(str(tmp_path / "train" / "checkpoint.pt"), str(tmp_path / "snapshots"), G=gan.G,
                                  augment_pipe=augment.AugmentPipe(**augment.PIPES["bgc"]))
    import pickle
    with open(path, "rb") as f:
        assert pickle.load(f)["augment_pipe"].p.item() == pytest.approx(p[-1], abs=1e-7)


class AugmentPipe(nn.Module):
    """A stand-in for NVIDIA's training.augment.AugmentPipe, as their code is written: the same
    class name, settings and buffers, and a geometric pipe whose padding is a margin drawn at
    random and read into Python (which neither scripts nor traces)."""

    def __init__(self, **settings):
        super().__init__()
        from ganc import augment
        ours = augment.AugmentPipe(**settings)
        for name in augment._SETTINGS:
            setattr(self, name, getattr(ours, name))
        for name, buffer in ours.named_buffers():
            self.register_buffer(name, buffer.clone())

    def forward(self, images, debug_percentile=None):
        margin = int(torch.randint(1, 4, [1]).item())
        padded = F.pad(images, [margin] * 4, mode="reflect")
        shift = torch.where(torch.rand([]) < self.p * self.xint, 1, 0)
        return padded.roll(int(shift), dims=3)[:, :, margin:-margin, margin:-margin]


class HandWrittenADA(nn.Module):
    """A hand-written loss with NVIDIA's pipe in front of D."""

    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(8, 3 * 16 * 16), nn.Tanh())
        self.D = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 1))
        self.augment_pipe = AugmentPipe(xflip=1, xint=1, rotate=1, brightness=1)
        self.augment_pipe.p.fill_(0.5)

    def phase_d(self, real, z):
        fake = self.G(z).view(-1, 3, 16, 16).detach()
        return (F.softplus(self.D(self.augment_pipe(fake))).mean()
                + F.softplus(-self.D(self.augment_pipe(real))).mean())

    def phase_g(self, z):
        return F.softplus(-self.D(self.augment_pipe(self.G(z).view(-1, 3, 16, 16)))).mean()


def test_nvidias_augment_pipe_in_a_hand_written_loss_is_exported_as_ganc_s(ganc_bin, digits16, tmp_path):
    """NVIDIA's AugmentPipe (a stand-in by their class name, settings and buffers) inside a
    hand-written loss: the export says it replaced it by ganc's pipe with the same settings and
    p (every shape static) instead of failing in the trace, and the archive trains at 2 ranks
    bit for bit like eager DDP."""
    torch.manual_seed(0)
    gan = HandWrittenADA()
    spec = {"ganc_spec": 1, "name": "hand_ada", "batch_size": 4, "data": {"shape": [3, 16, 16]},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["D"],
                        "inputs": [{"name": "real", "source": "data"}, {"name": "z", "source": "normal", "shape": [8]}]},
                       {"name": "g", "method": "phase_g", "updates": ["G"],
                        "inputs": [{"name": "z", "source": "normal", "shape": [8]}]}],
            "optimizers": {"D": {"type": "adam", "lr": 1e-3}, "G": {"type": "adam", "lr": 1e-3}}}
    model, plan = str(tmp_path / "hand.pt"), str(tmp_path / "hand.plan")
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ganc.export(gan, model, spec)
    assert "augment_pipe: replaced (NVIDIA's AugmentPipe pads each batch by a margin drawn at random" in out.getvalue()
    archive = torch.jit.load(model)
    assert archive.augment_pipe.original_name == "AugmentPipe" and archive.augment_pipe.xflip == 1.0
    assert archive.augment_pipe.p.item() == 0.5 and archive.augment_pipe.geom_taps == 12  # ganc's pipe
    gradients_equal_eager_ddp(ganc_bin, model, plan, spec, digits16, 3, 5, tmp_path)
