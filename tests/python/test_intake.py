"""Code as people write it goes in unchanged: the hybrid export (phases scripted, networks that
do not script traced alone at the calls the phases make), autograd Functions checked and
derived, and every hazard of tracing refused at export in one line naming the submodule, the
file:line and the construct.

The parity test trains the StyleGAN2-ADA-style zoo model with ganc and, as the reference, the
same Python classes eagerly under DistributedDataParallel (their own autograd Functions and
backward), on the same data, seeds and world size.
"""
import copy
import functools
import json
import os
import random
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ganc
from ganc import reference
from conftest import archive, gradient_dumps

import zoo

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 17  # Dreg (every 16) runs twice, Gpl (every 4) five times
SEED = 3


def relative_error(a, b):
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def train_two_ranks(ganc_bin, model, data, out, *extra):
    """`ganc run` of `model` at 2 ranks for STEPS steps, dumping every all-reduced gradient into
    out/dump; returns the run's stdout."""
    plan = os.path.join(out, "plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    run = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", data,
                          "--steps", str(STEPS), "--seed", str(SEED), "--out", os.path.join(out, "train"),
                          "--sample-every", "0", "--checkpoint-every", "0", "--log-every", str(STEPS),
                          "--dump-grads", os.path.join(out, "dump"), *extra],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_stylegan2_ada_style_code_trains_like_eager_ddp(ganc_bin, digits16, tmp_path):
    """Gmain, Gpl (path length), Dmain and Dreg (R1) through traced networks whose convolutions
    are autograd Functions with a hand-written double backward, their resampling and bias +
    activation fused into ganc::upfirdn2d and ganc::bias_act: ganc's all-reduced gradients
    (derived by autograd from the Functions' forwards) and final parameters against eager DDP
    running the Python classes with their own backward, at 2 ranks. In float64: the
    reference's Functions compute the same gradients with other kernels (conv_transpose2d for
    the input's, convolution_backward for the weight's) than autograd derives from their
    forwards, so float32 sums round differently in the last bits, which Adam's first,
    sign-like steps amplify over 17 steps (to 4e-4 relative); float64 leaves 1e-9 of room."""
    model = archive("stylegan2_ada_f64")
    spec = ganc.load_spec(model)
    out = train_two_ranks(ganc_bin, model, digits16, str(tmp_path), "--fusion", "on")
    # Fused (--fusion on; the CPU's default is off): the reference upfirdn2d and bias_act of
    # every phase run as ganc's ops, against eager DDP on the reference compositions.
    for phase in ("Gmain", "Gpl", "Dmain", "Dreg"):
        assert re.search(rf"phase '{phase}': fused [1-9]\d* resampling\(s\) as ganc::upfirdn2d and [1-9]\d* bias", out), out
    # Both regularisers leave parameters without a gradient, which DDP refuses: those phases'
    # reference all-reduces by hand with DDP's arithmetic (as for the zoo's StyleGAN2).
    reference.run(model, digits16, 2, STEPS, SEED, out_dir=str(tmp_path / "ddp"),
               reducer={"Gpl": "manual", "Dreg": "manual"},
               eager_model=functools.partial(zoo.module, "stylegan2_ada"))  # made float64 by the oracle
    phases = set()
    for step, phase, got, ref in gradient_dumps(spec, STEPS, str(tmp_path / "dump"), str(tmp_path / "ddp")):
        phases.add(phase)
        for name in ref:
            err = relative_error(got[name].float(), ref[name].float())
            assert err <= 1e-9, f"step {step} {phase}: {name} differs by {err:.3g}"
    assert phases == {"Gmain", "Gpl", "Dmain", "Dreg"}
    # Every phase of the plan replays as a captured graph on CUDA: the traced networks' shape
    # arithmetic stays on the host, and the per-call dispatch reads every parameter.
    explained = subprocess.run([ganc_bin, "explain", str(tmp_path / "plan")], capture_output=True, text=True,
                               check=True).stdout
    assert explained.count("replay on CUDA: CUDA Graph") == 4, explained
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    assert set(got) == set(ref)
    for name in ref:
        err = relative_error(got[name].float(), ref[name].float())
        assert err <= 1e-9, f"final {name} differs by {err:.3g}"


def test_stylegan3_style_code_trains_fused_like_eager_ddp(ganc_bin, digits16, tmp_path):
    """StyleGAN3-T as NVIDIA writes it (filtered_lrelu's reference path: separable filters in
    two passes, pads then crops; `update_emas=True` by keyword in Dmain), every resampling and
    bias + activation fused, against eager DDP on the reference compositions at 2 ranks, float64
    (float32 rounds the fused filters' sums otherwise and Adam amplifies it): every all-reduced
    gradient and the final parameters within 1e-9, the magnitude EMAs Dmain updates included."""
    model = archive("stylegan3_f64")
    spec = ganc.load_spec(model)
    out = train_two_ranks(ganc_bin, model, digits16, str(tmp_path), "--fusion", "on")
    for phase in ("Gmain", "Dmain", "Dreg"):
        assert re.search(rf"phase '{phase}': fused [1-9]\d* resampling\(s\) as ganc::upfirdn2d and [1-9]\d* bias", out), out
    fused = explained(ganc_bin, str(tmp_path / "plan"))
    assert all(p["not_fused"] == [] for p in fused.values()), {n: p["not_fused"] for n, p in fused.items()}
    assert fused["Gmain"]["fused"]["upfirdn2d"] >= 10  # two passes per separable filter, ToRGB's too
    # The per-value dispatch of the traced networks leaves every phase capturable on CUDA.
    assert all(p["eager_reason"] == "" for p in fused.values()), {n: p["eager_reason"] for n, p in fused.items()}
    reference.run(model, digits16, 2, STEPS, SEED, out_dir=str(tmp_path / "ddp"), reducer={"Dreg": "manual"},
               eager_model=functools.partial(zoo.module, "stylegan3"))
    worst = 0.0
    for step, phase, got, ref in gradient_dumps(spec, STEPS, str(tmp_path / "dump"), str(tmp_path / "ddp")):
        worst = max([worst] + [relative_error(got[name], ref[name]) for name in ref])
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    assert set(got) == set(ref) and any("magnitude_ema" in name for name in ref)
    worst = max([worst] + [relative_error(got[name], ref[name]) for name in ref])
    print(f"fused StyleGAN3-style float64 against eager DDP: {worst:.3g} relative at worst")
    assert worst <= 1e-9, worst


def test_stylegan3_style_code_unfused_trains_bit_for_bit_like_eager_ddp(ganc_bin, digits16, tmp_path):
    """The float32 archive as a CPU run takes it by default (--fusion auto is off on the CPU):
    the traced variants per keyword value and the crops as written train bit for bit like
    eager DDP (gradients of every phase run, final parameters and buffers). The plan compiled
    with fusion records it; the plan the run trained (its run directory's) fuses nothing, and
    the run says so in one line."""
    model = archive("stylegan3")
    spec = ganc.load_spec(model)
    out = train_two_ranks(ganc_bin, model, digits16, str(tmp_path))
    assert "fusion: off on the CPU (--fusion auto)" in out, out
    assert not re.search(r"phase '\w+': fused", out), out
    fused = {tuple(p["fused"].values()) for p in json.loads(subprocess.run(
        [ganc_bin, "explain", str(tmp_path / "plan"), "--json"], check=True, capture_output=True).stdout)["phases"]}
    trained = {tuple(p["fused"].values()) for p in json.loads(subprocess.run(
        [ganc_bin, "explain", str(tmp_path / "train"), "--json"], check=True, capture_output=True).stdout)["phases"]}
    assert (0, 0) not in fused and trained == {(0, 0)}, (fused, trained)
    # Eager DDP on the Python module: the joint graphs (the CPU's door) hold what it runs.
    reference.run(model, digits16, 2, STEPS, SEED, out_dir=str(tmp_path / "ddp"), reducer={"Dreg": "manual"},
                  eager_model=functools.partial(zoo.module, "stylegan3"))
    phases = set()
    for step, phase, got, ref in gradient_dumps(spec, STEPS, str(tmp_path / "dump"), str(tmp_path / "ddp")):
        phases.add(phase)
        assert all(torch.equal(got[name], ref[name]) for name in ref), (step, phase)
    assert phases == {"Gmain", "Dmain", "Dreg"}
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    assert set(got) == set(ref) and all(torch.equal(got[name], ref[name]) for name in ref)


def largest_difference(spec, got_dir, ref_dir, exact):
    """The largest relative difference of the all-reduced gradients of every phase run and of
    the final parameters; with `exact`, asserts each is bitwise equal."""
    worst, phases = 0.0, set()
    for step, phase, got, ref in gradient_dumps(spec, STEPS, got_dir, ref_dir):
        phases.add(phase)
        for name in ref:
            err = relative_error(got[name], ref[name])
            assert not exact or torch.equal(got[name], ref[name]), f"step {step} {phase}: {name} differs by {err:.3g}"
            worst = max(worst, err)
    assert phases == {"Gmain", "Gpl", "Dmain", "Dreg"}
    got = ganc.load_checkpoint(os.path.join(got_dir, "params_final.pt"))
    ref = torch.load(os.path.join(ref_dir, "params_final.pt"))
    assert set(got) == set(ref)
    for name in ref:
        err = relative_error(got[name], ref[name])
        assert not exact or torch.equal(got[name], ref[name]), f"final {name} differs by {err:.3g}"
        worst = max(worst, err)
    return worst


def test_fir_filters_take_ganc_double_backward_bit_for_bit(ganc_bin, digits16, tmp_path):
    """R1 (Dreg) and path length (Gpl) differentiate twice through upfirdn2d's depthwise FIR
    convolutions (groups = channels, a filter that takes no gradient), where PyTorch's double
    backward makes one convolution per channel. ganc runs them as ganc::convolution (the
    default, --double-backward filters) and still trains bit for bit like eager DDP on the
    archive, which takes PyTorch's own double backward: every all-reduced gradient of every
    phase run and the final parameters, float32, 2 ranks."""
    model = archive("stylegan2_ada")
    # Unfused (--fusion off): the convolutions as the model wrote them; the archive's code (the
    # joint graphs have their own test below).
    out = train_two_ranks(ganc_bin, model, digits16, str(tmp_path), "--fusion", "off", "--executor", "torchscript")
    # Their filter convolutions: 2 per discriminator block in R1; G's upsampling filters and
    # modulated convolutions (which keep PyTorch's double backward: their weight takes a
    # gradient) in path length.
    assert "phase 'Dreg': 4 grouped convolutions run as ganc::convolution" in out, out
    assert re.search(r"phase 'Gpl': \d+ grouped convolutions run as ganc::convolution", out), out
    reference.run(model, digits16, 2, STEPS, SEED, out_dir=str(tmp_path / "ddp"), reducer={"Gpl": "manual", "Dreg": "manual"})
    assert largest_difference(ganc.load_spec(model), str(tmp_path / "dump"), str(tmp_path / "ddp"), exact=True) == 0


def test_joint_graphs_take_ganc_double_backward_of_fir_filters_bit_for_bit(ganc_bin, digits16, tmp_path):
    """The same phases through their joint graphs (the CPU's default door): the export captured
    each grouped convolution as ganc::convolution, so R1's and path length's double backward of
    the FIR filters is ganc's whole-convolution kernels, not one convolution per channel, and
    the four phases train bit for bit like eager DDP on the Python module the archive was
    exported from (the joint graphs hold what its autograd Functions' own backward runs; the
    archive's code derives theirs from their forwards, last bits apart in float32): every
    all-reduced gradient and the final parameters, float32, 2 ranks. `--double-backward
    pytorch` and `grouped` take the archive's code instead, saying why."""
    model = archive("stylegan2_ada")
    out = train_two_ranks(ganc_bin, model, digits16, str(tmp_path), "--fusion", "off")
    for phase in ("Gmain", "Gpl", "Dmain", "Dreg"):
        assert f"{phase} (joint graph, ganc's executor)" in out, out
    assert "phase 'Dreg': 4 grouped convolutions run as ganc::convolution" in out, out
    assert re.search(r"phase 'Gpl': \d+ grouped convolutions run as ganc::convolution", out), out
    reference.run(model, digits16, 2, STEPS, SEED, out_dir=str(tmp_path / "ddp"), reducer={"Gpl": "manual", "Dreg": "manual"},
                  eager_model=functools.partial(zoo.module, "stylegan2_ada"))
    assert largest_difference(ganc.load_spec(model), str(tmp_path / "dump"), str(tmp_path / "ddp"), exact=True) == 0
    plan = str(tmp_path / "plan")
    for mode in ("pytorch", "grouped"):
        explain = subprocess.run([ganc_bin, "compile", model, "-o", plan], capture_output=True, text=True)
        run = subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", digits16, "--steps", "1",
                              "--out", str(tmp_path / mode), "--fusion", "off", "--double-backward", mode,
                              "--sample-every", "0", "--checkpoint-every", "0"], capture_output=True, text=True)
        assert explain.returncode == 0 and run.returncode == 0, run.stderr
        assert "Gmain (joint graph, ganc's executor)" in run.stdout and "Dreg (eager)" in run.stdout, run.stdout


def test_fused_stylegan2_ada_trains_like_eager_ddp_in_float32(ganc_bin, digits16, tmp_path):
    """The float32 archive fused (ganc::upfirdn2d, ganc::bias_act in every phase, their own
    derivatives in R1 and path length) against eager DDP on the reference compositions, 2
    ranks, 17 steps. Each phase's first all-reduced gradients (the same parameters on both
    sides) within 1e-5 relative (R1's is the largest, 3e-6): the fused resampling's filter is
    flipped and its stride taken by the convolution, so its sums round otherwise (bias_act is
    the reference's kernels on the CPU, bit for bit). Every gradient of the first 8 steps (two
    path-length runs) within 1e-4 (1.1e-5 measured). From there the two runs part: Adam's
    first steps are sign-like, so a gradient element within rounding of Adam's eps moves its
    parameter by a learning rate on one side and not the other, and a leaky ReLU input within
    rounding of zero takes the other slope; how soon depends on the CPU's vector width
    (with AVX-512, 0.016 at step 8 and 2.0 at step 14 on a noise strength near zero). The float64
    test above bounds the whole run at 1e-9; unfused, the float32 run is bit for bit (the test
    above)."""
    model = archive("stylegan2_ada")
    spec = ganc.load_spec(model)
    train_two_ranks(ganc_bin, model, digits16, str(tmp_path), "--fusion", "on")
    reference.run(model, digits16, 2, STEPS, SEED, out_dir=str(tmp_path / "ddp"), reducer={"Gpl": "manual", "Dreg": "manual"})
    first, early = {}, 0.0
    for step, phase, got, ref in gradient_dumps(spec, STEPS, str(tmp_path / "dump"), str(tmp_path / "ddp")):
        err = max(relative_error(got[name], ref[name]) for name in ref)
        first.setdefault(phase, err)
        if step < 8:
            early = max(early, err)
    print(f"fused float32 against eager DDP: first gradients {first}, {early:.3g} relative at worst in steps 0-7")
    assert set(first) == {"Gmain", "Gpl", "Dmain", "Dreg"}
    assert all(err <= 1e-5 for err in first.values()), first
    assert early <= 1e-4, early


def test_every_grouped_convolution_takes_ganc_double_backward_to_rounding(ganc_bin, digits16, tmp_path):
    """--double-backward grouped: the grouped modulated convolutions too, whose weight takes a
    gradient. The second-order weight gradient is then one grouped weight-gradient kernel
    where PyTorch sums per-group convolutions: equal to rounding, so in float64, against eager
    DDP on the archive (1e-9; float32 differs in the last bits, which Adam's first, sign-like
    steps amplify over 17 steps)."""
    model = archive("stylegan2_ada_f64")
    out = train_two_ranks(ganc_bin, model, digits16, str(tmp_path), "--double-backward", "grouped")
    assert "(--double-backward grouped)" in out, out
    trained = open(os.path.join(tmp_path, "train", "plan.ganc")).read()  # the plan as it trained
    assert trained.count("double_backward grouped") == 2 and "double_backward filters" not in trained
    reference.run(model, digits16, 2, STEPS, SEED, out_dir=str(tmp_path / "ddp"), reducer={"Gpl": "manual", "Dreg": "manual"})
    worst = largest_difference(ganc.load_spec(model), str(tmp_path / "dump"), str(tmp_path / "ddp"), exact=False)
    assert 0 < worst <= 1e-9, worst


def explained(ganc_bin, plan):
    return {ph["name"]: ph for ph in json.loads(subprocess.run([ganc_bin, "explain", plan, "--json"],
                                                               capture_output=True, text=True, check=True).stdout)["phases"]}


class LearnedFilterD(nn.Module):
    """A discriminator whose resampling filter is a parameter: the reference upfirdn2d's shape,
    but a learned filter, so not a resampling to fuse."""

    def __init__(self):
        super().__init__()
        self.filter = nn.Parameter(torch.full([4, 4], 1 / 16))
        self.fc = nn.Linear(4 * 2 * 2, 1)

    def forward(self, x):
        c = x.shape[1]
        x = F.pad(x, [1, 1, 1, 1])
        x = F.conv2d(x, self.filter[None, None].repeat([c, 1, 1, 1]), groups=c)
        return self.fc(x[:, :, ::2, ::2].flatten(1))


class LearnedFilterGAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = nn.Linear(2, 4 * 4 * 4)
        self.discriminator = LearnedFilterD()

    def phase_d(self, real):
        return F.softplus(self.discriminator(real)).mean()

    def phase_g(self, z):
        return F.softplus(-self.discriminator(self.generator(z).reshape(-1, 4, 4, 4))).mean()


def test_fusion_is_planned_explained_and_switched_off(ganc_bin, tmp_path):
    """`ganc compile` records per phase what the runtime fuses (the zoo's StyleGAN2-ADA: its
    resampling and bias + activation in every phase), `--fusion off` records none, and a
    learned filter is left alone with why and where."""
    model = archive("stylegan2_ada")
    plan, unfused = str(tmp_path / "on.plan"), str(tmp_path / "off.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    subprocess.run([ganc_bin, "compile", model, "-o", unfused, "--fusion", "off"], check=True, capture_output=True)
    on, off = explained(ganc_bin, plan), explained(ganc_bin, unfused)
    assert set(on) == {"Gmain", "Gpl", "Dmain", "Dreg"}
    for name, phase in on.items():
        assert phase["fused"]["upfirdn2d"] > 0 and phase["fused"]["bias_act"] > 0, (name, phase["fused"])
        assert phase["not_fused"] == [], phase["not_fused"]
        assert off[name]["fused"] == {"upfirdn2d": 0, "bias_act": 0}
        # The IR is the code as written: fusion changes no used parameter and no bucket.
        assert phase["used"] == off[name]["used"] and phase["buckets"] == off[name]["buckets"]
    report = subprocess.run([ganc_bin, "explain", plan], capture_output=True, text=True, check=True).stdout
    assert "fused: 4 resampling(s) as ganc::upfirdn2d" in report, report
    # R1 and path length differentiate inside themselves: ganc's double backward, decided here.
    assert {name: phase["double_backward"] for name, phase in on.items()} == \
        {"Gmain": "", "Gpl": "filters", "Dmain": "", "Dreg": "filters"}
    assert "double backward: the phase differentiates inside itself" in report, report

    z = {"name": "z", "source": "normal", "shape": [2]}
    spec = {"ganc_spec": 1, "name": "learned", "batch_size": 4, "data": {"shape": [4, 4, 4]},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["discriminator"],
                        "inputs": [{"name": "real", "source": "data"}]},
                       {"name": "g", "method": "phase_g", "updates": ["generator"], "inputs": [z]}],
            "optimizers": {"generator": {"type": "adam", "lr": 1e-3}, "discriminator": {"type": "adam", "lr": 1e-3}}}
    archive_path, learned = str(tmp_path / "learned.pt"), str(tmp_path / "learned.plan")
    ganc.export(LearnedFilterGAN(), archive_path, spec, verbose=False)
    subprocess.run([ganc_bin, "compile", archive_path, "-o", learned], check=True, capture_output=True)
    for phase in explained(ganc_bin, learned).values():
        assert phase["fused"]["upfirdn2d"] == 0
        assert [m["pattern"] for m in phase["not_fused"]] == ["upfirdn2d"], phase["not_fused"]
        assert re.match(r"a learned filter \(computed from a parameter\) \(test_intake\.py:\d+\)$",
                        phase["not_fused"][0]["why"]), phase["not_fused"]


def test_traced_g_ema_draws_the_sample_grid(ganc_bin, digits16, tmp_path):
    """G_ema, traced in eval mode at the training batch, draws a 20-image grid in the runtime
    (three batches of 8, the last one filled up and trimmed)."""
    model = archive("stylegan2_ada")
    plan = str(tmp_path / "plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    out = tmp_path / "run"
    subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", digits16, "--steps", "1",
                    "--samples", "20", "--out", str(out), "--checkpoint-every", "1"], check=True,
                   capture_output=True, timeout=300)
    assert (out / "samples.png").exists()


def test_export_says_what_was_traced_and_why(tmp_path, capsys):
    gan, spec = zoo.build("stylegan2_ada")
    ganc.export(gan, str(tmp_path / "m.pt"), spec)
    out = capsys.readouterr().out
    assert re.search(r"ganc.export: G: container \(no phase calls it; its forward: Compiled functions can't "
                     r"take variable number of arguments.*stylegan2_ada.py:\d+\)", out), out
    assert re.search(r"ganc.export: G.synthesis: (traced|one trace per call) at forward\(\[8, \d+, 32\]\), "
                     r"forward\(\[4, \d+, 32\]\)", out), out
    assert re.search(r"ganc.export: D: (traced|one trace per call) at forward\(\[8, 3, 16, 16\]\)", out), out
    assert re.search(r"ganc.export: G_ema: .* in eval mode", out), out
    assert re.search(r"torch.autograd.Function _FusedMultiplyAdd \(.*stylegan2_ada.py:\d+\).*: gradient derived "
                     r"from its forward; matches its backward and double backward", out), out
    # The user's model is left as it was, state-dict names included.
    loaded = torch.jit.load(str(tmp_path / "m.pt"))
    assert list(loaded.state_dict()) == list(gan.state_dict())
    for name, t in gan.state_dict().items():
        assert torch.equal(t, loaded.state_dict()[name]), name


# -- refusals: one line naming the submodule, the file:line and the construct -----------------

class KwargsNet(nn.Module):
    """Does not script (**kwargs), so it is traced."""

    def __init__(self, body):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.body = body

    def forward(self, x, **kwargs):
        return self.fc(self.body(x))


class FlipsWithPythonRandom(nn.Module):
    def forward(self, x):
        if random.random() < 0.5:  # frozen by a trace: the same branch every step
            x = x.flip(0)
        return x


class NumpyNoise(nn.Module):
    def forward(self, x):
        return x + float(np.random.randn())  # one number for the whole batch (an array draw goes in: test_draws)


class BranchOnValue(nn.Module):
    def forward(self, x):
        if x.mean() > 0:
            return x * 2
        return x


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


class Reversed(nn.Module):
    def forward(self, x):
        return GradReverse.apply(x)


class StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, grad):
        return grad


class Rounded(nn.Module):
    def forward(self, x):
        return StraightThrough.apply(x)


class Scale(torch.autograd.Function):
    """A rewrite of x * 2 with its own backward: exact, so it exports."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class Doubled(nn.Module):
    def forward(self, x):
        return Scale.apply(x)


class TinyGAN(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.generator = nn.Linear(2, 4)
        self.discriminator = KwargsNet(body)

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()

    def phase_dreg(self, real):
        x = real.detach().requires_grad_(True)
        g = torch.autograd.grad([self.discriminator(x).sum()], [x], create_graph=True)[0]
        assert g is not None
        return g.square().sum(1).mean()

    def phase_g(self, z):
        return F.softplus(-self.discriminator(self.generator(z))).mean()


def tiny_spec():
    z = {"name": "z", "source": "normal", "shape": [2]}
    return {"ganc_spec": 1, "name": "tiny", "batch_size": 8, "data": {"shape": [4]},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["discriminator"],
                        "inputs": [{"name": "real", "source": "data"}, z]},
                       {"name": "dreg", "method": "phase_dreg", "updates": ["discriminator"], "interval": 2,
                        "inputs": [{"name": "real", "source": "data"}]},
                       {"name": "g", "method": "phase_g", "updates": ["generator"], "inputs": [z]}],
            "optimizers": {"generator": {"type": "adam", "lr": 1e-3},
                           "discriminator": {"type": "adam", "lr": 1e-3}}}


def line_of(cls, text):
    """file:line of the line of `cls`'s source holding `text`."""
    import inspect
    lines, start = inspect.getsourcelines(cls)
    return f"test_intake.py:{start + next(i for i, l in enumerate(lines) if text in l)}"


def refusal(gan, tmp_path, spec=None) -> str:
    """The one-line ExportError exporting `gan` raises; nothing is written."""
    with pytest.raises(ganc.ExportError) as info:
        ganc.export(gan, str(tmp_path / "m.pt"), spec or tiny_spec(), verbose=False)
    message = str(info.value)
    assert "\n" not in message
    assert not os.path.exists(tmp_path / "m.pt")
    return message


@pytest.mark.parametrize("body,construct,marker", [
    (FlipsWithPythonRandom, r"random\.random\(\) \(Python randomness\)", "random.random()"),
    (NumpyNoise, r"numpy\.random\.randn\(\) \(Python randomness\)", "np.random.randn"),
    (BranchOnValue, r"Python branch on a tensor value \(`if tensor:`, `while`, `and`/`or`\)", "if x.mean() > 0"),
])
def test_what_a_trace_would_freeze_is_refused(tmp_path, body, construct, marker):
    with pytest.raises(ganc.ExportError) as info:
        ganc.export(TinyGAN(body()), str(tmp_path / "m.pt"), tiny_spec(), verbose=False)
    message = str(info.value)
    assert "\n" not in message
    assert re.search(rf"^ganc.export: discriminator.body \(.*{re.escape(line_of(body, marker))}\): {construct} in a "
                     r"module that does not script .*: a trace would freeze it", message), message
    assert not os.path.exists(tmp_path / "m.pt")


class Synthesis(nn.Module):
    """Does not script (**kwargs); the phases call it directly."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 4)
        self.body = FlipsWithPythonRandom()

    def forward(self, z, **kwargs):
        return self.body(self.fc(z))


class Generator(nn.Module):
    """StyleGAN's shape: a forward no phase calls (so it becomes a container) over a synthesis
    network the phases call."""

    def __init__(self):
        super().__init__()
        self.synthesis = Synthesis()

    def forward(self, z, **kwargs):
        return self.synthesis(z)


class ContainerGAN(TinyGAN):
    def __init__(self):
        super().__init__(nn.Identity())
        self.generator = Generator()

    def phase_d(self, real, z):
        fake = self.generator.synthesis(z).detach()
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()

    def phase_g(self, z):
        return F.softplus(-self.discriminator(self.generator.synthesis(z))).mean()


def test_a_refusal_under_a_container_is_the_error(tmp_path):
    """A network the phases call, under a parent they do not call: its own refusal is the
    error, not the phases' failure to script over the container it was left as."""
    message = refusal(ContainerGAN(), tmp_path)
    marker = line_of(FlipsWithPythonRandom, "random.random()")
    assert re.search(rf"^ganc.export: generator.synthesis.body \(.*{re.escape(marker)}\): "
                     r"random\.random\(\) \(Python randomness\) in a module that does not script", message), message


class HalfGenerator(nn.Module):
    """StyleGAN2's float16 layers: the weight pre-normalised by 1 / sqrt(fan-in) taken from its
    shape with numpy, then a float16 convolution. Traced, the sizes are tensors, so the trace
    divides by a 0-dim float64 tensor where eager multiplies by a float64 number: the weights
    differ in their last float32 bit, some float16 products by a rounding. Does not script
    (**kwargs)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 256 * 16)
        self.weight = nn.Parameter(torch.randn(256, 256, 3, 3))

    def forward(self, z, **kwargs):
        out_channels, in_channels, kh, kw = self.weight.shape
        w = self.weight * (1 / np.sqrt(in_channels * kh * kw) / self.weight.norm(float("inf"), dim=[1, 2, 3],
                                                                                  keepdim=True))
        x = self.fc(z).reshape(z.shape[0], 256, 4, 4).half()
        return F.conv2d(x, w.half(), padding=1).float()


class HalfGAN(nn.Module):
    def __init__(self, discriminator=None):
        super().__init__()
        self.generator = HalfGenerator()
        self.discriminator = discriminator or nn.Sequential(nn.Flatten(), nn.Linear(256 * 16, 1))

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()

    def phase_g(self, z):
        return F.softplus(-self.discriminator(self.generator(z))).mean()


def half_spec():
    z = {"name": "z", "source": "normal", "shape": [2]}
    return {"ganc_spec": 1, "name": "half", "batch_size": 8, "data": {"shape": [256, 4, 4]},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["discriminator"],
                        "inputs": [{"name": "real", "source": "data"}, z]},
                       {"name": "g", "method": "phase_g", "updates": ["generator"], "inputs": [z]}],
            "optimizers": {"generator": {"type": "adam", "lr": 1e-3},
                           "discriminator": {"type": "adam", "lr": 1e-3}}}


def test_a_float16_trace_agrees_with_eager_to_its_rounding(tmp_path, capsys):
    """A float16 network whose trace differs from eager by a rounding (sizes traced as tensors)
    exports, and its line says how far from eager and that it is not bit for bit; the phases
    then run the trace."""
    torch.manual_seed(0)
    gan = HalfGAN()
    ganc.export(gan, str(tmp_path / "m.pt"), half_spec())
    out = capsys.readouterr().out
    found = re.search(r"ganc.export: generator: traced at forward\(\[8, 2\]\): .*; computes in float16, agreeing "
                      r"with eager to ([0-9.e-]+) relative \(float16 rounds at 0.00098\), not bit for bit", out)
    assert found, out
    assert 1e-5 < float(found.group(1)) <= 4 * 2 ** -10, out
    loaded = torch.jit.load(str(tmp_path / "m.pt"))
    z = torch.randn(8, 2)
    with torch.no_grad():
        traced, eager = loaded.generator(z), gan.generator(z)
    difference = ((traced - eager).abs().max() / eager.abs().max()).item()
    assert 0 < difference <= 4 * 2 ** -10  # the trace itself, not a re-scripted eager


class FixedInHalf(nn.Module):
    """float16, and a value of its input taken through numpy: a trace freezes it."""

    def forward(self, x, **kwargs):
        return (x.half() * torch.from_numpy(x.detach().numpy().std(0, keepdims=True)).half()).float()


def test_a_float16_trace_that_fixed_a_value_is_refused(tmp_path):
    """The rounding allowed a float16 trace does not let a frozen value through."""
    message = refusal(TinyGAN(FixedInHalf()), tmp_path)
    assert re.search(r"^ganc.export: discriminator \(KwargsNet, .*\): its trace computes otherwise than eager with a "
                     r"second input of forward\(\[8, 4\]\) \(by [0-9.e-]+ relative\): the trace fixed a value of its "
                     r"example input; the tracer warned at .*Converting a tensor to a NumPy array", message), message


@pytest.mark.parametrize("body,function,order", [(Reversed, "GradReverse", "first"),
                                                 (Rounded, "StraightThrough", "first")])
def test_functions_whose_backward_is_not_their_gradient_are_refused(tmp_path, body, function, order):
    message = refusal(TinyGAN(body()), tmp_path)
    assert re.search(rf"^ganc.export: torch.autograd.Function {function} \(.*test_intake.py:\d+\) in "
                     rf"discriminator.body: its backward is not the gradient of its forward \(the {order} "
                     r"derivatives differ", message), message


def test_traced_network_takes_a_gradient_penalty_like_eager(tmp_path):
    """A traced D (it does not script) under R1 with create_graph, an exact autograd Function
    inside: each phase's loss and gradients equal eager's."""
    torch.manual_seed(0)
    gan = TinyGAN(Doubled())
    path = str(tmp_path / "m.pt")
    ganc.export(gan, path, tiny_spec(), verbose=False)
    phases_match_eager(gan, torch.jit.load(path), ("phase_d", "phase_dreg", "phase_g"))


def phases_match_eager(gan, loaded, methods, after=None):
    """Each of tiny_spec's phase `methods` of the loaded archive against the eager module's on
    the same inputs: the loss bit for bit, every parameter's gradient to 1e-6 relative;
    `after(method)` checks more after each."""
    real, z = torch.randn(8, 4), torch.randn(8, 2)
    for method in methods:
        args = (real, z) if method == "phase_d" else (real,) if method == "phase_dreg" else (z,)
        want = getattr(gan, method)(*args)
        got = getattr(loaded, method)(*args)
        assert torch.equal(want, got), method
        want_grads = torch.autograd.grad(want, list(gan.parameters()), allow_unused=True)
        got_grads = torch.autograd.grad(got, list(loaded.parameters()), allow_unused=True)
        for a, b in zip(want_grads, got_grads):
            assert (a is None) == (b is None)
            assert a is None or torch.allclose(a, b, rtol=1e-6, atol=0), method
        if after:
            after(method)


class NoiseInput(nn.Module):
    """StyleGAN's noise input: fresh noise made on the device of the activations
    (`device=x.device`, which a trace records as the device it ran on)."""

    def __init__(self):
        super().__init__()
        self.strength = nn.Parameter(torch.full([], 0.5))

    def forward(self, x):
        return x + torch.randn([x.shape[0], x.shape[1]], device=x.device) * self.strength


def test_traced_noise_follows_the_device_of_its_input(tmp_path):
    """The export traces on the CPU; the traced network trains on the GPU. Its noise is made
    on the device its input is on, not on the CPU the trace ran on (checked on the meta
    device, which every machine has)."""
    path = str(tmp_path / "m.pt")
    ganc.export(TinyGAN(NoiseInput()), path, tiny_spec(), verbose=False)
    network = torch.jit.load(path, map_location="meta").discriminator
    out = network(torch.zeros(8, 4, device="meta"))
    assert out.device.type == "meta" and out.shape == (8, 1)


class Scaled(nn.Module):
    """Does not script (**kwargs); takes constants as StyleGAN's layers do (`update_emas`,
    `noise_mode`, a gain) beside its tensor, and updates a buffer when told to."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.register_buffer("magnitude", torch.ones([]))

    def forward(self, x, gain=1.0, mode="sum", update_emas=False, **kwargs):
        if update_emas:
            self.magnitude.copy_(x.detach().square().mean().lerp(self.magnitude, 0.9))
        y = self.fc(x * self.magnitude.rsqrt()) * gain
        return y if mode == "sum" else y.abs()


class CalledWithConstants(TinyGAN):
    """Phases that pass constants by keyword and by position, through a helper whose
    unannotated default says its type (`def run_d(self, x, update_emas=False)`)."""

    def __init__(self):
        super().__init__(nn.Identity())
        self.discriminator = Scaled()

    def run_d(self, x, update_emas=False):
        return self.discriminator(x, 2.0, update_emas=update_emas)

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        return F.softplus(self.run_d(fake, update_emas=True)).mean() + F.softplus(-self.run_d(real)).mean()

    def phase_g(self, z):
        return F.softplus(-self.discriminator(self.generator(z), mode="abs")).mean()


def test_keywords_and_constants_reach_a_traced_network_per_value(tmp_path, capsys):
    """Each distinct set of constants a traced network is called with is a trace of its own,
    and the network's forward a dispatch with its own parameter names: the loaded archive's
    phases equal eager's: losses and the buffer the keyword updates bit for bit, gradients to
    rounding (autograd differentiates the trace's recorded operations)."""
    torch.manual_seed(0)
    gan = CalledWithConstants()
    path = str(tmp_path / "m.pt")
    ganc.export(gan, path, tiny_spec())
    out = capsys.readouterr().out
    assert re.search(r"discriminator: traced at forward\(\[8, 4\], gain=2.0, update_emas=True\), "
                     r"forward\(\[8, 4\], gain=2.0, update_emas=False\), .*forward\(\[8, 4\], mode='abs'\)", out), out
    loaded = torch.jit.load(path)

    def same_buffer(method):
        assert torch.equal(gan.discriminator.magnitude, loaded.discriminator.magnitude), method
    phases_match_eager(gan, loaded, ("phase_d", "phase_dreg", "phase_g", "phase_d"), after=same_buffer)
    assert gan.discriminator.magnitude.item() != 1.0  # phase_d's update_emas=True ran, twice


class AlreadyScripted(TinyGAN):
    """Networks the user scripted and traced before handing them to ganc (as the docs once
    advised): taken as they are."""

    def __init__(self):
        super().__init__(nn.Identity())
        self.generator = torch.jit.script(nn.Linear(2, 4))
        self.discriminator = torch.jit.trace(nn.Sequential(nn.Linear(4, 4), nn.LeakyReLU(0.2), nn.Linear(4, 1)),
                                             torch.randn(3, 4))


class TypedLayer(nn.Module):
    """R3GAN's layers keep their dtype as a Python attribute; this one does not script (*args)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.DataType = torch.float64

    def forward(self, x, *args):
        return F.leaky_relu(self.lin(x), 0.2)


class ReadsItsChildren(nn.Module):
    """R3GAN's discriminator: reads a child's Python attribute; fails to script for its children."""

    def __init__(self):
        super().__init__()
        self.MainLayers = nn.ModuleList([TypedLayer(), TypedLayer()])
        self.fc = nn.Linear(4, 1).double()

    def forward(self, x):
        x = x.to(self.MainLayers[0].DataType)
        for layer in self.MainLayers:
            x = layer(x)
        return self.fc(x).float()


def test_a_traced_parent_sees_its_childrens_python_attributes(tmp_path, capsys):
    """The children are traced first (each alone) and the parent then: its forward still reads
    `self.MainLayers[0].DataType`, which the children's traces do not keep as TorchScript
    attributes; it exports and computes what eager does."""
    gan = TinyGAN(nn.Identity())
    gan.discriminator = ReadsItsChildren()
    for layer in gan.discriminator.MainLayers:
        layer.double()
    eager = copy.deepcopy(gan.discriminator)
    path = str(tmp_path / "m.pt")
    ganc.export(gan, path, tiny_spec())
    assert re.search(r"discriminator: traced at forward\(\[8, 4\]\)", capsys.readouterr().out)
    x = torch.randn(8, 4)
    assert torch.equal(torch.jit.load(path).discriminator(x), eager(x))


class FailsUnderTheTracer(nn.Module):
    def forward(self, x, **kwargs):
        if torch.jit.is_tracing():  # code that runs eagerly and fails traced (a library's own guard)
            raise RuntimeError("this layer cannot be traced")
        return x


def test_a_network_that_fails_under_the_tracer_is_refused_in_one_line(tmp_path):
    message = refusal(TinyGAN(FailsUnderTheTracer()), tmp_path)
    assert re.search(r"^ganc.export: discriminator \(KwargsNet, .*\): tracing its forward at forward\(\[8, 4\]\) "
                     r"failed: RuntimeError: this layer cannot be traced \([^)]*" + re.escape(
                         line_of(FailsUnderTheTracer, "raise RuntimeError")) + r"\)", message), message


def test_networks_already_scripted_or_traced_are_taken_as_they_are(tmp_path, capsys):
    """A regression: the probe's hooks were registered on ScriptModules too, which refuse
    them ("register_forward_pre_hook is not supported on ScriptModules")."""
    torch.manual_seed(0)
    gan = AlreadyScripted()
    path = str(tmp_path / "m.pt")
    ganc.export(gan, path, tiny_spec())
    assert "ganc.export: scripted: generator, discriminator" in capsys.readouterr().out
    phases_match_eager(gan, torch.jit.load(path), ("phase_d", "phase_dreg", "phase_g"))


class ComputesLoss(nn.Module):
    """A discriminator whose forward scripts and whose loss method does not (**kwargs)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(F.leaky_relu(x, 0.2))

    def compute_loss(self, x, target, **kwargs):
        logits = self.forward(x)
        return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


class CallsALossMethod(TinyGAN):
    def __init__(self):
        super().__init__(nn.Identity())
        self.discriminator = ComputesLoss()

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        return self.discriminator.compute_loss(fake, 0.0) + self.discriminator.compute_loss(real, 1.0)

    def phase_g(self, z):
        return self.discriminator.compute_loss(self.generator(z), 1.0)


def test_a_submodule_method_that_does_not_script_is_traced_at_its_calls(tmp_path, capsys):
    """A phase calls a method other than forward that does not script (the module's forward
    does): the module is traced at the method's calls, as at forward's (the export failed
    naming "the phases"), and the archive's phases equal eager's."""
    torch.manual_seed(0)
    gan = CallsALossMethod()
    path = str(tmp_path / "m.pt")
    ganc.export(gan, path, tiny_spec())
    out = capsys.readouterr().out
    assert re.search(r"discriminator: traced at compute_loss\(\[8, 4\], target=0.0\), compute_loss\(\[8, 4\], "
                     r"target=1.0\), forward\(\[8, 4\]\): Compiled functions can't take variable number", out), out
    phases_match_eager(gan, torch.jit.load(path), ("phase_d", "phase_dreg", "phase_g"))


class Doubles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


@torch.jit.ignore
def doubled(x: torch.Tensor) -> torch.Tensor:
    return Doubles.apply(x)


class CallsPython(nn.Module):
    """Scripts, but keeps a call of a Python function (@torch.jit.ignore), which torch.jit.save
    refuses ("Could not export Python function call")."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(doubled(x))


class PhaseCallsPython(TinyGAN):
    def phase_g(self, z):
        return F.softplus(-self.discriminator(doubled(self.generator(z)))).mean()


def test_a_scripted_module_that_calls_python_is_traced_like_one_that_does_not_script(tmp_path, capsys):
    torch.manual_seed(0)
    gan = TinyGAN(nn.Identity())
    gan.discriminator = CallsPython()
    path = str(tmp_path / "m.pt")
    ganc.export(gan, path, tiny_spec())
    out = capsys.readouterr().out
    assert re.search(r"discriminator: traced at forward\(\[8, 4\]\): it calls the Python function 'doubled' "
                     r"\(.*test_intake.py:\d+\), which runs in Python", out), out
    phases_match_eager(gan, torch.jit.load(path), ("phase_d", "phase_dreg", "phase_g"))
    # In a phase method itself, one line naming the function (not TorchScript's save error).
    (tmp_path / "phase").mkdir()
    message = refusal(PhaseCallsPython(nn.Identity()), tmp_path / "phase")
    assert re.search(r"^ganc.export: PhaseCallsPython \(the phases\): it calls the Python function 'doubled' "
                     r"\(.*test_intake.py:\d+\)", message), message


class ListConstant(TinyGAN):
    def phase_g(self, z):
        return F.softplus(-self.discriminator(self.generator(z), sizes=[1, 2])).mean()


class TensorOrConstant(TinyGAN):
    def phase_g(self, z):
        return F.softplus(-self.discriminator(self.generator(z), gain=torch.ones([]))).mean()

    def phase_dreg(self, real):
        x = real.detach().requires_grad_(True)
        g = torch.autograd.grad([self.discriminator(x, gain=2.0).sum()], [x], create_graph=True)[0]
        assert g is not None
        return g.square().sum(1).mean()


def test_calls_a_trace_cannot_take_are_refused_naming_the_parameter(tmp_path):
    message = refusal(ListConstant(nn.Identity()), tmp_path)
    assert re.search(r"^ganc.export: discriminator \(KwargsNet, .*test_intake.py:\d+\) does not script and its "
                     r"forward is called with sizes=\[1, 2\] \(list\): a traced network takes tensors and "
                     r"constants", message), message
    message = refusal(TensorOrConstant(nn.Identity()), tmp_path)
    assert re.search(r"^ganc.export: discriminator \(KwargsNet, .*\) does not script and its forward's gain is a "
                     r"(constant|tensor) in phase '\w+' \(forward\(.*\)\) and a (tensor|constant) in phase", message), message


class ShapeFromInput(nn.Module):
    """A Python int from the input's size fixes the trace to that batch (the zoo's minibatch
    standard deviation does this): each call is traced on its own."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x, **kwargs):
        n = int(x.shape[0])
        return x.reshape(n, -1).sum(1, keepdim=True) * self.scale / n


class TwoBatchSizes(TinyGAN):
    def __init__(self):
        super().__init__(nn.Identity())
        self.discriminator = ShapeFromInput()

    def phase_dreg(self, real):
        x = real[:4].detach().requires_grad_(True)
        g = torch.autograd.grad([self.discriminator(x).sum()], [x], create_graph=True)[0]
        assert g is not None
        return g.square().sum(1).mean()


def test_a_trace_that_fixes_a_shape_is_traced_per_call(tmp_path, capsys):
    gan = TwoBatchSizes()
    path = str(tmp_path / "m.pt")
    ganc.export(gan, path, tiny_spec())
    out = capsys.readouterr().out
    assert "ganc.export: scripted: generator" in out, out
    assert "discriminator: one trace per call at forward([8, 4]), forward([4, 4])" in out, out
    loaded = torch.jit.load(path)
    real = torch.randn(8, 4)
    assert torch.equal(loaded.phase_dreg(real), gan.phase_dreg(real))
    z = torch.randn(8, 2)
    assert torch.equal(loaded.phase_d(real, z), gan.phase_d(real, z))


# -- operator libraries -----------------------------------------------------------------------

def op_library():
    """The test tree's TORCH_LIBRARY library (tests/ops/BiasAct.cpp), built with the tests."""
    path = os.environ.get("GANC_TEST_OPS", os.path.join(os.environ.get("GANC_BUILD_DIR", ""), "tests",
                                                         "libganc_test_ops.so"))
    if not os.path.isfile(path):
        pytest.fail(f"{path} is not built (the ganc_test_ops target of tests/CMakeLists.txt)")
    torch.ops.load_library(path)
    return path


class FusedDiscriminator(nn.Module):
    """Calls ganc_test::bias_act, StyleGAN's fused bias + leaky ReLU + gain, as one operator."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 16, bias=False)
        self.b1 = nn.Parameter(torch.randn(16) * 0.1)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(torch.ops.ganc_test.bias_act(self.fc1(x), self.b1, 0.2, 1.4142135623730951))


class OpGAN(TinyGAN):
    """TinyGAN's phases (R1 included) on 2-d points, D calling the library's operator."""

    def __init__(self):
        super().__init__(nn.Identity())
        self.generator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 2))
        self.discriminator = FusedDiscriminator()


def make_op_gan():
    torch.manual_seed(0)
    return OpGAN()


def test_an_operator_library_exports_compiles_and_trains_like_eager_ddp(ganc_bin, datasets, tmp_path):
    """A network calling a TORCH_LIBRARY operator with a C++ autograd kernel (R1 through it
    too): the archive names the library, compile and train refuse in one line without
    --op-library, and with it ganc trains at 2 ranks equal to eager DDP calling the same op."""
    library = op_library()
    model = str(tmp_path / "ops.pt")
    spec = dict(tiny_spec(), name="ops", data={"shape": [2]})  # the ring's 2-d points
    ganc.export(make_op_gan(), model, spec, op_libraries=[library], verbose=False)
    import zipfile
    with zipfile.ZipFile(model) as z:
        needs = [n for n in z.namelist() if n.endswith("extra/ganc_ops.json")]
        assert needs, z.namelist()
        # Its backward reads nothing of x or b (the slope comes from a detached value): the
        # measured rows keep b1 out of R1's used parameters, as in eager autograd.
        assert json.loads(z.read(needs[0])) == {"libraries": ["libganc_test_ops.so"],
                                                "ops": ["ganc_test::bias_act"],
                                                "backward_reads": {"ganc_test::bias_act": [[], [], [], []]}}
    plan = str(tmp_path / "ops.plan")
    refused = subprocess.run([ganc_bin, "compile", model, "-o", plan], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert ("needs the operator ganc_test::bias_act from the operator library libganc_test_ops.so, which "
            "is not loaded: pass --op-library PATH/libganc_test_ops.so") in refused.stderr
    subprocess.run([ganc_bin, "compile", model, "-o", plan, "--op-library", library], check=True,
                   capture_output=True)
    train = [ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", datasets["ring"],
             "--steps", "6", "--seed", str(SEED), "--sample-every", "0", "--checkpoint-every", "0",
             "--log-every", "6"]
    refused = subprocess.run(train + ["--out", str(tmp_path / "refused")], capture_output=True, text=True)
    assert refused.returncode != 0 and "pass --op-library PATH/libganc_test_ops.so" in refused.stderr
    subprocess.run(train + ["--out", str(tmp_path / "train"), "--op-library", library,
                            "--dump-grads", str(tmp_path / "ganc")], check=True, capture_output=True, timeout=600)
    with open(tmp_path / "train" / "run.json") as f:
        assert json.load(f)["op_libraries"] == [library]
    # R1's phase leaves the last layer's bias without a gradient, which DDP refuses: that
    # phase's reference all-reduces by hand with DDP's arithmetic.
    reference.run(model, datasets["ring"], 2, 6, SEED, out_dir=str(tmp_path / "ddp"),
               reducer={"dreg": "manual"}, eager_model=make_op_gan, op_libraries=[library])
    loaded = ganc.load_spec(model)
    for step, phase, got, ref in gradient_dumps(loaded, 6, str(tmp_path / "ganc"), str(tmp_path / "ddp")):
        for name in ref:
            err = relative_error(got[name], ref[name])
            assert err <= 1e-5, f"step {step} {phase}: {name} differs by {err:.3g}"
    got = ganc.load_checkpoint(str(tmp_path / "ganc" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    for name in ref:
        assert relative_error(got[name], ref[name]) <= 1e-4, name


def test_an_operator_library_path_may_hold_a_comma(ganc_bin, datasets, tmp_path):
    """--op-library takes a path with a comma whole where that file exists (a comma otherwise
    separates several); ganc.compile and ganc.train pass each library as a flag of its own.
    (The copy is loaded by a process of its own: one process registers a library's namespace
    once.)"""
    source = os.environ.get("GANC_TEST_OPS", os.path.join(os.environ.get("GANC_BUILD_DIR", ""), "tests",
                                                           "libganc_test_ops.so"))
    library = tmp_path / "ops,v2" / "libganc_test_ops.so"
    library.parent.mkdir()
    shutil.copy(source, library)
    model = str(tmp_path / "ops.pt")
    export = subprocess.run([sys.executable, "-c", f"""
import sys
sys.path.insert(0, {HERE!r})
import ganc, test_intake
spec = dict(test_intake.tiny_spec(), name="ops", data={{"shape": [2]}})
ganc.export(test_intake.make_op_gan(), {model!r}, spec, op_libraries=[{str(library)!r}], verbose=False)
"""], capture_output=True, text=True)
    assert export.returncode == 0, export.stderr
    plan = str(tmp_path / "ops.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan, "--op-library", str(library)], check=True,
                   capture_output=True)
    run = subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", datasets["ring"], "--steps", "1",
                          "--out", str(tmp_path / "train"), "--sample-every", "0", "--op-library", str(library)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert ganc.compile(model, str(tmp_path / "api.plan"), op_libraries=[str(library)]).path.endswith("api.plan")


def test_a_python_custom_op_is_refused_with_what_to_do(tmp_path):
    @torch.library.custom_op("ganc_intake_py::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @scale.register_fake
    def _(x):
        return torch.empty_like(x)

    scale.register_autograd(lambda ctx, grad: grad * 2)

    class PyOp(nn.Module):
        def forward(self, x):
            return torch.ops.ganc_intake_py.scale(x)

    with pytest.raises(ganc.ExportError, match=r"^ganc.export: discriminator.* calls the operator "
                                               r"ganc_intake_py::scale, which is registered from Python \(a "
                                               r"torch.library.custom_op\): .*TORCH_LIBRARY"):
        ganc.export(TinyGAN(PyOp()), str(tmp_path / "m.pt"), tiny_spec(), verbose=False)


# -- PyTorch-GAN's way: `*block(...)` lists, a module-level shape, `view(n, *img_shape)` -----

img_shape = (1, 4, 4)


class PyTorchGANGenerator(nn.Module):
    """PyTorch-GAN's WGAN-GP generator, as written there: it does not script (`*img_shape`)."""

    def __init__(self, latent_dim=8):
        super().__init__()

        def block(in_feat, out_feat, normalize=True):
            layers = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(*block(latent_dim, 32, normalize=False), *block(32, 64),
                                   nn.Linear(64, int(np.prod(img_shape))), nn.Tanh())

    def forward(self, z):
        img = self.model(z)
        img = img.view(img.shape[0], *img_shape)
        return img


class PyTorchGANDiscriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(int(np.prod(img_shape)), 32), nn.LeakyReLU(0.2, inplace=True),
                                   nn.Linear(32, 1))

    def forward(self, img):
        img_flat = img.view(img.shape[0], -1)
        return self.model(img_flat)


class PyTorchGANWGANGP(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = PyTorchGANGenerator()
        self.discriminator = PyTorchGANDiscriminator()

    def phase_d(self, real, z, alpha):
        fake = self.generator(z).detach()
        x = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        g = torch.autograd.grad([self.discriminator(x).sum()], [x], create_graph=True)[0]
        assert g is not None
        penalty = ((g.reshape(g.shape[0], -1).norm(2, dim=1) - 1) ** 2).mean()
        return -self.discriminator(real).mean() + self.discriminator(fake).mean() + 10 * penalty

    def phase_g(self, z):
        return -self.discriminator(self.generator(z)).mean()


def test_pytorch_gan_wgan_gp_exports_and_takes_its_penalty_like_eager(tmp_path, capsys):
    """The generator does not script (`view(n, *img_shape)`): it is traced; D scripts. The
    critic phase's gradient penalty and both phases' gradients equal eager's."""
    spec = {"ganc_spec": 1, "name": "pytorch_gan_wgan_gp", "batch_size": 8, "data": {"shape": list(img_shape)},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["discriminator"],
                        "inputs": [{"name": "real", "source": "data"},
                                   {"name": "z", "source": "normal", "shape": [8]},
                                   {"name": "alpha", "source": "uniform", "shape": [1, 1, 1]}]},
                       {"name": "g", "method": "phase_g", "updates": ["generator"], "interval": 5,
                        "inputs": [{"name": "z", "source": "normal", "shape": [8]}]}],
            "optimizers": {"generator": {"type": "adam", "lr": 1e-4, "betas": [0.5, 0.9]},
                           "discriminator": {"type": "adam", "lr": 1e-4, "betas": [0.5, 0.9]}}}
    torch.manual_seed(0)
    gan = PyTorchGANWGANGP()
    path = str(tmp_path / "m.pt")
    ganc.export(gan, path, spec)
    out = capsys.readouterr().out
    assert "ganc.export: scripted: discriminator" in out, out
    assert re.search(r"ganc.export: generator: traced at forward\(\[8, 8\]\): .*test_intake.py:\d+", out), out
    loaded = torch.jit.load(path)
    real, z, alpha = torch.rand(8, *img_shape) * 2 - 1, torch.randn(8, 8), torch.rand(8, 1, 1, 1)
    for method, args in (("phase_d", (real, z, alpha)), ("phase_g", (z,))):
        want = getattr(gan, method)(*args)
        got = getattr(loaded, method)(*args)
        assert torch.equal(want, got), method
        want_grads = torch.autograd.grad(want, list(gan.parameters()), allow_unused=True)
        got_grads = torch.autograd.grad(got, list(loaded.parameters()), allow_unused=True)
        for a, b in zip(want_grads, got_grads):
            assert (a is None) == (b is None)
            assert a is None or torch.equal(a, b), method
