"""ganc.export of what people write: PyTorch's spectral norm and weight norm (both APIs) through
scriptable equivalents with the same state_dict names and the same numbers, traced archives
checked for training before they are written, and the user's model left as it was."""
import json
import os
import random
import subprocess
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import spectral_norm, weight_norm
from torch.nn.utils.parametrizations import spectral_norm as p_spectral_norm
from torch.nn.utils.parametrizations import weight_norm as p_weight_norm

import ganc
from conftest import archive


class Reparametrised(nn.Module):
    """Every supported layer kind under every supported reparametrisation."""

    def __init__(self):
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the old weight_norm API
            self.conv = spectral_norm(nn.Conv2d(3, 8, 3))
            self.conv_p = p_spectral_norm(nn.Conv2d(8, 8, 3), n_power_iterations=2)
            self.up = spectral_norm(nn.ConvTranspose2d(8, 4, 3))            # dim 1
            self.up_p = p_spectral_norm(nn.ConvTranspose2d(4, 4, 1))
            self.fc = p_weight_norm(nn.Linear(4 * 10 * 10, 5))
            self.fc_old = weight_norm(nn.Linear(5, 3))
            self.embed = p_spectral_norm(nn.Embedding(10, 3))

    def forward(self, x):
        h = self.up_p(self.up(self.conv_p(self.conv(x))))
        return self.fc_old(self.fc(h.flatten(1))) + self.embed(torch.arange(x.size(0)))


@pytest.fixture(autouse=True)
def plain_interpreter():
    # As ganc and the oracle run archives: eager autograd, no profiling-executor fusion.
    old = torch._C._get_graph_executor_optimize()
    torch._C._set_graph_executor_optimize(False)
    yield
    torch._C._set_graph_executor_optimize(old)


def test_scriptable_layers_match_pytorch_bit_for_bit():
    torch.manual_seed(0)
    eager = Reparametrised().train()
    copy = ganc.make_scriptable(eager)
    copy.eval()  # scripting reads the weight properties: no power iteration meanwhile
    scripted = torch.jit.script(copy)
    scripted.train()
    with torch.no_grad():
        for name, t in scripted.state_dict().items():
            t.copy_(eager.state_dict()[name])
    assert list(scripted.state_dict()) == list(eager.state_dict())
    x = torch.randn(2, 3, 12, 12)
    for _ in range(3):  # training mode: the power iterations update u and v each call
        a, b = eager(x), scripted(x)
        assert torch.equal(a, b)
        for name, t in eager.state_dict().items():
            assert torch.equal(t, scripted.state_dict()[name]), name
    a.square().sum().backward()
    b.square().sum().backward()
    grads = dict(scripted.named_parameters())
    for name, p in eager.named_parameters():
        assert torch.equal(p.grad, grads[name].grad), name
    eager.eval()
    scripted.eval()
    assert torch.equal(eager(x), scripted(x))


def test_unsupported_reparametrisations_name_the_layer():
    chained = nn.Sequential(nn.Linear(3, 3))
    p_spectral_norm(chained[0])
    torch.nn.utils.parametrize.register_parametrization(chained[0], "weight", nn.Identity())
    with pytest.raises(ganc.ExportError, match=r"0: 2 parametrizations chained on 'weight'"):
        ganc.make_scriptable(chained)
    on_bias = nn.Sequential(spectral_norm(nn.Linear(3, 3), name="bias"))
    with pytest.raises(ganc.ExportError, match=r"0: SpectralNorm on 'bias'"):
        ganc.make_scriptable(on_bias)


def test_export_leaves_the_model_as_it_was(tmp_path):
    import zoo
    gan, spec = zoo.build("sndcgan32")
    gan.eval()
    before = {k: v.clone() for k, v in gan.state_dict().items()}
    ganc.export(gan, str(tmp_path / "m.pt"), spec)
    assert not gan.training
    for name, t in gan.state_dict().items():
        assert torch.equal(t, before[name]), f"export changed {name}"
    archive = torch.jit.load(str(tmp_path / "m.pt"))
    assert list(archive.state_dict()) == list(before)
    for name, t in archive.state_dict().items():
        assert torch.equal(t, before[name]), f"the archive holds another {name}"


def test_checkpoints_load_into_the_users_own_modules(ganc_bin, datasets, tmp_path):
    """ganc trains the exported sndcgan32; its checkpoint loads, strictly, into a fresh
    TorchSNDCGAN built with PyTorch's own spectral_norm and weight_norm."""
    import zoo
    gan, spec = zoo.build("sndcgan32")
    model = str(tmp_path / "sn.pt")
    ganc.export(gan, model, spec)
    plan = str(tmp_path / "sn.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True)
    out = str(tmp_path / "run")
    subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", datasets["digits"], "--steps", "2",
                    "--out", out, "--checkpoint-every", "2", "--sample-every", "0"], check=True,
                   capture_output=True)
    ckpt = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))
    fresh = zoo.TorchSNDCGAN()
    fresh.discriminator.load_state_dict(ckpt["discriminator"])
    fresh.generator.load_state_dict(ckpt["generator"])
    trained = fresh.discriminator.main[0].weight_orig
    assert not torch.equal(trained, gan.discriminator.main[0].weight_orig), "nothing was trained"


class CannotTrain(nn.Module):
    """Traces fine, but its backward fails: sigmoid saves its output, which is then changed in
    place."""

    def __init__(self):
        super().__init__()
        self.generator = nn.Linear(2, 2)
        self.discriminator = nn.Linear(2, 1)

    def phase_d(self, real):
        y = torch.sigmoid(self.discriminator(real))
        y.mul_(2.0)
        return y.mean()

    def phase_g(self, z):
        return self.discriminator(self.generator(z)).mean()


def test_a_traced_archive_that_cannot_train_is_refused(tmp_path):
    spec = {"ganc_spec": 2, "name": "probe", "batch_size": 4, "data": {"shape": [2]},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["discriminator"],
                        "inputs": [{"name": "real", "source": "data"}]},
                       {"name": "g", "method": "phase_g", "updates": ["generator"],
                        "inputs": [{"name": "z", "source": "normal", "shape": [2]}]}]}
    path = tmp_path / "probe.pt"
    with pytest.raises(ganc.ExportError, match=r"phase 'd': the traced archive cannot train: RuntimeError: "
                                               r".*modified by an inplace operation"):
        ganc.export(CannotTrain(), str(path), spec, trace=True)
    assert not path.exists()


class DrawsInItsPhase(torch.nn.Module):
    """A Python draw in a phase method and one in a network: a whole trace would freeze both."""

    def __init__(self, in_network):
        super().__init__()
        self.generator = nn.Linear(2, 2)
        self.discriminator = nn.Sequential(nn.Linear(2, 1), Flips()) if in_network else nn.Linear(2, 1)

    def phase_d(self, real):
        return F.softplus(-self.discriminator(real)).mean()

    def phase_g(self, z):
        scale = 2.0 if random.random() < 0.5 else 1.0  # the phase's draw
        return F.softplus(-self.discriminator(self.generator(z) * scale)).mean()


class Flips(nn.Module):
    def forward(self, x):
        return -x if random.random() < 0.5 else x  # the network's draw


@pytest.mark.parametrize("in_network", [False, True])
def test_a_whole_trace_refuses_what_it_would_freeze(tmp_path, in_network):
    """trace=True runs the same hazard checks as the hybrid export, over the phase methods too
    (it used to freeze `random.random()` into the archive)."""
    spec = {"ganc_spec": 1, "name": "probe", "batch_size": 4, "data": {"shape": [2]},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["discriminator"],
                        "inputs": [{"name": "real", "source": "data"}]},
                       {"name": "g", "method": "phase_g", "updates": ["generator"],
                        "inputs": [{"name": "z", "source": "normal", "shape": [2]}]}]}
    path = tmp_path / "probe.pt"
    where = "the network's draw" if in_network else "the phase's draw"
    with pytest.raises(ganc.ExportError) as info:
        ganc.export(DrawsInItsPhase(in_network), str(path), spec, trace=True)
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if where in text)
    who = "discriminator.1" if in_network else "DrawsInItsPhase"
    assert str(info.value).startswith(f"ganc.export: {who} (") and f"test_export.py:{line}): random.random() " \
        "(Python randomness) in a phase traced whole (trace=True)" in str(info.value), str(info.value)
    assert not path.exists()


def test_traced_spectral_norm_exports_and_trains(ganc_bin, datasets, tmp_path):
    """trace=True on the same model: the power iteration is traced through the scriptable
    layers (PyTorch's own hooks record out= ops autograd refuses), and the archive trains."""
    import zoo
    gan, spec = zoo.build("sndcgan32")
    model = str(tmp_path / "traced.pt")
    ganc.export(gan, model, spec, trace=True)
    plan = str(tmp_path / "traced.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True)
    result = subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", datasets["digits"],
                             "--steps", "2", "--out", str(tmp_path / "o"), "--sample-every", "0"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_update_paths_and_optimizer_groups_are_resolved_against_the_model(tmp_path):
    """The Python validator resolves `updates` and `params` paths as `ganc compile` does."""
    import zoo
    gan, spec = zoo.build("dcgan32_freezed")
    bad = dict(spec, phases=[dict(spec["phases"][0], updates=["discriminator.main.9"]), spec["phases"][1]])
    with pytest.raises(ganc.SpecError, match=r"updates 'discriminator.main.9', which names no parameter"):
        ganc.export(gan, str(tmp_path / "a.pt"), bad)
    bad = dict(spec, optimizers=dict(spec["optimizers"], head={"type": "adam", "params": ["generator.main.0"]}))
    with pytest.raises(ganc.SpecError, match=r"'generator.main.0.weight' is in optimizer groups 'g_first_block' "
                                             r"and 'head'"):
        ganc.export(gan, str(tmp_path / "b.pt"), bad)
    groups = ganc.spec.optimizer_groups(spec, [n for n, _ in gan.named_parameters()])
    assert list(groups) == ["discriminator", "g_first_block", "generator"]
    assert groups["discriminator"] == ["discriminator.main.4.weight", "discriminator.main.4.bias",
                                       "discriminator.main.6.weight", "discriminator.main.6.bias"]
    assert groups["g_first_block"] == ["generator.main.0.weight", "generator.main.1.weight",
                                       "generator.main.1.bias"]


def synchronised_in_g(ganc_bin, gan, spec, listed, tmp_path):
    """Exports `gan` with `sync_batch_norm` = `listed` and compiles it: the archive, the plan and
    how many batch norms phase g runs synchronised."""
    name = "_".join(listed)
    path, plan = str(tmp_path / f"{name}.pt"), str(tmp_path / f"{name}.plan")
    ganc.export(gan, path, dict(spec, sync_batch_norm=listed))
    subprocess.run([ganc_bin, "compile", path, "-o", plan], check=True, capture_output=True)
    phase_g = open(plan).read().split("phase @g")[1].split("phase @")[0]
    return path, plan, phase_g.count("ganc::sync_batch_norm(")


def test_sync_batch_norm_paths_are_resolved_against_the_model(ganc_bin, tmp_path):
    """`sync_batch_norm` takes submodules by path, dotted ones too, in the Python validator as in
    `ganc compile`: one layer of the generator is rewritten where one is listed, all three
    where the generator is; a path to no module, or to one without batch norm, is refused by
    both."""
    import zoo
    gan, spec = zoo.build("dcgan32_syncbn")
    rewritten = {}
    for listed in (["generator"], ["generator.main.1"]):
        path, _, rewritten[listed[0]] = synchronised_in_g(ganc_bin, gan, spec, listed, tmp_path)
    assert rewritten == {"generator": 3, "generator.main.1": 1}
    for listed, says in ((["generator.main.99"], "'generator.main.99' is not a submodule"),
                         (["discriminator.main.0"], "'discriminator.main.0' has no batch norm layer")):
        with pytest.raises(ganc.SpecError, match=says):
            ganc.export(gan, str(tmp_path / "bad.pt"), dict(spec, sync_batch_norm=listed))
        unchecked = str(tmp_path / "unchecked.pt")
        torch.jit.save(torch.jit.load(path), unchecked, _extra_files={
            "ganc.json": json.dumps(dict(ganc.load_spec(path), sync_batch_norm=listed))})
        result = subprocess.run([ganc_bin, "compile", unchecked, "-o", str(tmp_path / "bad.plan")],
                                capture_output=True, text=True)
        assert result.returncode == 2 and "'sync_batch_norm' names" in result.stderr, result.stderr


def test_sync_batch_norm_finds_layers_without_weights(ganc_bin, datasets, tmp_path):
    """Batch norms without a weight are synchronised too: BigGAN's conditional ones
    (`affine=False`, found by their running statistics) and one with no running statistics
    either (found by the module calls it was inlined from), by the generator or by the one
    block listed; each trains at 2 ranks."""
    import zoo
    gan, spec = zoo.build("biggan32")
    block = gan.generator.blocks[0]
    block.bn1.bn = torch.nn.BatchNorm2d(block.bn1.bn.num_features, affine=False, track_running_stats=False)
    rewritten = {}
    for listed in (["generator"], ["generator.blocks.0"]):
        path, plan, rewritten[listed[0]] = synchronised_in_g(ganc_bin, gan, spec, listed, tmp_path)
        subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", path, "--data", datasets["digits"],
                        "--steps", "2", "--out", str(tmp_path / "run"), "--force", "--sample-every", "0",
                        "--checkpoint-every", "0"], check=True, capture_output=True, timeout=300)
    # Three blocks of two conditional batch norms, and the plain one before the output layer.
    assert rewritten == {"generator": 7, "generator.blocks.0": 2}


def test_torch_syncbatchnorm_layers_are_synchronised(ganc_bin, datasets, tmp_path):
    """A model written for DDP with torch.nn.SyncBatchNorm (convert_sync_batchnorm) exports as
    it is: each SyncBatchNorm becomes batch norm listed in `sync_batch_norm`, so it trains bit
    for bit like dcgan32_syncbn (the same weights, `sync_batch_norm: ["generator"]`) at 2 ranks,
    the user's model keeps its SyncBatchNorm layers, and a ganc_spec 1 spec is refused with
    the layers named."""
    import zoo
    gan, spec = zoo.build("dcgan32")
    gan.generator = nn.SyncBatchNorm.convert_sync_batchnorm(gan.generator)
    layers = ["generator.main.1", "generator.main.4", "generator.main.7"]
    with pytest.raises(ganc.SpecError, match="SyncBatchNorm layers \\(" + ", ".join(layers) + "\\).*ganc_spec"):
        ganc.export(gan, str(tmp_path / "v1.pt"), spec)
    path = str(tmp_path / "syncbatchnorm.pt")
    assert ganc.export(gan, path, dict(spec, ganc_spec=2))["sync_batch_norm"] == layers
    assert all(isinstance(gan.get_submodule(layer), nn.SyncBatchNorm) for layer in layers)
    final = {}
    for name, model in (("converted", path), ("listed", archive("dcgan32_syncbn"))):
        plan = str(tmp_path / f"{name}.plan")
        subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
        subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", datasets["digits"],
                        "--steps", "3", "--out", str(tmp_path / name), "--sample-every", "0",
                        "--checkpoint-every", "3", "--keep-checkpoints", "0"],
                       check=True, capture_output=True, timeout=300)
        checkpoint = ganc.load_checkpoint(str(tmp_path / name / "checkpoint.pt"))
        final[name] = {f"{owner}.{k}": t for owner in ("generator", "discriminator")
                       for k, t in checkpoint[owner].items()}
    assert final["converted"].keys() == final["listed"].keys()
    assert any("running_var" in k for k in final["listed"])
    assert all(torch.equal(final["converted"][k], final["listed"][k]) for k in final["listed"])


def test_sample_submodule_is_resolved_against_the_model(ganc_bin, tmp_path):
    """The sample grid's submodule must be one of the model's, as `ganc compile` requires: the
    Python validator says so at export, not the compiler afterwards."""
    import zoo
    gan, spec = zoo.build("dcgan32")
    with pytest.raises(ganc.SpecError, match="sample submodule 'generater' does not exist"):
        ganc.export(gan, str(tmp_path / "a.pt"), dict(spec, sample=dict(spec["sample"], submodule="generater")))
    assert not (tmp_path / "a.pt").exists()


def test_export_and_load_spec_say_what_they_take(datasets, tmp_path):
    """A non-module, a folder that does not exist (said before the scripting work, not by
    torch.jit.save after it), a file that is not an archive: errors that say so."""
    import zoo
    gan, spec = zoo.build("mlp")
    with pytest.raises(TypeError, match="must be a torch.nn.Module, not int"):
        ganc.export(42, str(tmp_path / "a.pt"), spec)
    with pytest.raises(FileNotFoundError, match="the folder .*missing does not exist"):
        ganc.export(gan, str(tmp_path / "missing" / "a.pt"), spec)
    with pytest.raises(ValueError, match="is not a TorchScript archive"):
        ganc.load_spec(datasets["ring"])
    ganc.export(gan, str(tmp_path / "a.pt"), spec)
    assert ganc.load_spec(str(tmp_path / "a.pt"))["name"] == "mlp"


def test_torch_jit_deprecation_is_one_line_of_gancs_own(tmp_path, monkeypatch, capfd):
    """From torch 2.15 every torch.jit.script and torch.jit.trace warns that torch.jit is
    deprecated (a FutureWarning per scripted piece, on every export): an export says it once
    per process, in one line of its own; other warnings pass through."""
    import zoo
    from ganc import exporter
    script = torch.jit.script

    def deprecated_script(obj, *args, **kwargs):  # torch 2.15's warning, on 2.11 as well
        warnings.warn("`torch.jit.script` is deprecated. Please switch to `torch.compile` or `torch.export`.",
                      FutureWarning)
        return script(obj, *args, **kwargs)

    monkeypatch.setattr(torch.jit, "script", deprecated_script)
    monkeypatch.setattr(exporter, "_jit_noted", False)
    gan, spec = zoo.build("mlp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(2):
            ganc.export(gan, str(tmp_path / f"m{i}.pt"), spec, verbose=False)
            warnings.warn("a warning of the user's own", UserWarning)
    err = capfd.readouterr().err
    notes = [line for line in err.splitlines() if "deprecates TorchScript" in line]
    assert len(notes) == 1 and notes[0].startswith("ganc.export: note: torch "), err
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
    assert sum("of the user's own" in str(w.message) for w in caught) == 2
