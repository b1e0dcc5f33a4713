"""Gradient parity: ganc on Gloo against eager PyTorch DDP(find_unused_parameters=True).

For each model and world size, both train the same archive on the same data, seeds and
inputs for STEPS steps. Phase by phase they must agree on which parameters have a gradient,
on every all-reduced gradient (max |ganc - ddp| / max |ddp| <= 1e-5 per tensor), and, at
the end, on every parameter and buffer (<= 1e-4).

Adding a model is one line in MODELS: (archive name, dataset, world sizes[, reference]).
"""
import json
import os
import random
import subprocess

import pytest
import torch

import ganc
from ganc import reference
from conftest import archive, assert_equal, gradient_dumps

WORLDS = [1, 2, 3]
MODELS = [
    ("mlp", "ring", WORLDS),
    ("dcgan32", "digits", [1, 2]),
    # Three float32 addends sum differently in ganc's buckets than in DDP's (Gloo's ring adds
    # an element in an order set by its offset), a last-bit difference that Adam's sign-like
    # first steps amplify; at 2 ranks a + b == b + a and the float32 runs are bitwise equal.
    # The 3-rank DCGAN comparison runs in float64, where that rounding is far below 1e-5.
    ("dcgan32_f64", "digits", [3]),
    ("dcgan32_broadcast", "digits", [2]),  # DDP's broadcast_buffers=True policy
    ("probe_aux", "ring", [2]),            # unused head, in-place op, branch on a flag
    ("wgan_gp", "ring", [2]),              # double backward; 5 critic steps per G step
    ("cyclegan", "two_domains", [2]),      # two G and two D; phases updating two at once
    # Lazy R1 every 4 steps (double backward). Eager DDP itself fails on it ("gradient which
    # is undefined, but still allreduced"): the reference all-reduces by hand, DDP's way.
    ("r1gan", "ring", [2], "manual"),
    ("sngan", "ring", [2]),                # spectral norm: buffers updated in forward
    # PyTorch's own spectral norm (hook and parametrization APIs) in D, weight norm in G,
    # exported through ganc.export's scriptable equivalents.
    ("sndcgan32", "digits", [2]),
    # Training part of a network: FreezeD (D's two lower convolutions frozen), G's first block in
    # its own optimizer group at a tenth of the learning rate, the rest in its default group.
    ("dcgan32_freezed", "digits", [2]),
    # A learnable logit scale on the GAN module itself, stepped by its own SGD with D.
    ("mlp_temperature", "ring", [2]),
    # A branch on data (D's head by its input's mean): ranks and steps take
    # different heads; a head no rank reached keeps grad None and is not stepped, as in eager
    # DDP(find_unused_parameters=True). test_branch_... checks such steps occurred.
    ("mlp_branch", "ring", [2]),
    # Learning-rate schedules against torch.optim.lr_scheduler, all five types.
    ("mlp_schedules", "ring", [2]),
    ("mlp_schedules_decay", "ring", [2]),
    ("dcgan32_augment", "digits", [2]),    # dropout and augmentation draws inside the phases
    ("mlp_ema", "ring", [2]),              # generator EMA (StyleGAN2 rule) after every step
    ("cdcgan32", "digits", [2]),           # class-conditional: labels, projection D
    # Progressive growing, 8x8 -> 16x16 -> 32x32 in 3-step stages with 2-step fade-ins: ganc
    # runs one specialised plan per stage, DDP one model with find_unused_parameters=True.
    ("pggan_quick", "digits", [2]),
    # StyleGAN2: Gmain, Greg (path length, every 4), Dmain, Dreg (R1, every 16), G_ema. Both
    # regularisers leave a bias without a gradient (DDP fails as on lazy R1): those two phases'
    # reference all-reduces by hand; Gmain and Dmain go through DDP.
    ("stylegan2", "digits", [2], {"Greg": "manual", "Dreg": "manual"}),
    # Training-step features (ganc_spec 2), one at a time and together. Accumulation: D takes
    # 3 micro-batches per step, reference DDP with no_sync() on the first two.
    ("dcgan32_accumulate", "digits", [2]),
    # Clipping: G to a 2-norm of 0.05, D to a max-norm of 0.01, after the all-reduce, against
    # torch.nn.utils.clip_grad_norm_ (both bounds are far below the gradients' norms).
    ("dcgan32_clip", "digits", [2]),
    # bfloat16 autocast of every forward, against DDP under torch.autocast("cpu", bfloat16).
    ("dcgan32_bf16", "digits", [2]),
    ("dcgan32_amp", "digits", [2]),        # all of them at once, with a shared loss scaler
    # float16 autocast with a dynamic loss scaler shared by D and G, starting at 2^24: the
    # first steps overflow in float16 and are skipped, the scale backs off and grows again;
    # against torch.amp.GradScaler step for step.
    ("dcgan32_scaled", "digits", [2]),
    # A float16 loss that is inf on every D step: with a loss scaler ganc trains on, as eager
    # training with GradScaler does, instead of stopping on the non-finite loss.
    ("probe_overflow", "ring", [2]),
    # Synchronised batch norm in G, on Gloo: against one process training on both ranks' data
    # and noise concatenated, which SyncBatchNorm is defined to equal (eager SyncBatchNorm
    # refuses CPU tensors). The statistics are summed in another order, so, as at 3 ranks, the
    # comparison runs in float64.
    ("dcgan32_syncbn_f64", "digits", [2], "global"),
    # All five at once (dcgan32_all: synchronised batch norm in G, D accumulating 2 per-rank
    # micro-batches, a shared loss scaler, G clipped; bfloat16 autocast, which float64 leaves
    # alone on both sides), against one process on both ranks' micro-batches concatenated.
    ("dcgan32_all_f64", "digits", [2], "global"),
    # BigGAN's generator: conditional batch norms (BatchNorm2d(affine=False) scaled and shifted
    # per class) and a plain one, all synchronised; hinge loss, projection D. Likewise.
    ("biggan32_f64", "digits", [2], "global"),
]
# Models whose loss scaler must overflow, skip a step and back off within STEPS steps.
OVERFLOWING = {"dcgan32_scaled"}
CASES = [(m[0], m[1], w, m[3] if len(m) > 3 else "ddp") for m in MODELS for w in m[2]]
# GANC_PARITY_MODELS=a,b: those zoo models only (scripts/test_torch.sh's check on a second
# torch version names them; an unknown name is an error, not an empty run).
if os.environ.get("GANC_PARITY_MODELS"):
    _ONLY = os.environ["GANC_PARITY_MODELS"].split(",")
    _UNKNOWN = sorted(set(_ONLY) - {m[0] for m in MODELS})
    assert not _UNKNOWN, f"GANC_PARITY_MODELS names no zoo model of test_parity.py: {', '.join(_UNKNOWN)}"
    CASES = [c for c in CASES if c[0] in _ONLY]
STEPS = 10
SEED = 7


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| over the finite elements; inf and NaN must sit in the same places
    with the same values (a loss-scaled gradient that overflowed)."""
    finite = torch.isfinite(b)
    if not finite.all():
        if not torch.equal(torch.isfinite(a), finite) or not torch.equal(a[~finite].isnan(), b[~finite].isnan()):
            return float("inf")
        infs = ~finite & ~b.isnan()
        if not torch.equal(a[infs], b[infs]):
            return float("inf")
        a, b = a[finite], b[finite]
        if b.numel() == 0:
            return 0.0
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def run_ganc(ganc_bin, model, data, world, out, *extra, path=None):
    """Trains `model` (the test archive of that name, or the one at `path`) on `world` ranks,
    dumping every all-reduced gradient; returns the dump directory."""
    path = path or archive(model)
    plan = os.path.join(out, "plan.ganc")
    subprocess.run([ganc_bin, "compile", path, "-o", plan], check=True)
    subprocess.run([ganc_bin, "run", "--nproc", str(world), plan, "--model", path,
                    "--data", data, "--steps", str(STEPS), "--seed", str(SEED),
                    "--out", os.path.join(out, "train"), "--sample-every", "0",
                    "--checkpoint-every", "0", "--log-every", str(STEPS),
                    "--dump-grads", os.path.join(out, "ganc"), *extra],
                   check=True, timeout=600)
    return os.path.join(out, "ganc")


@pytest.mark.parametrize("model,dataset,world,reducer", CASES)
def test_gradients_and_parameters_match_eager_ddp(ganc_bin, datasets, tmp_path, model, dataset, world,
                                                  reducer):
    got_dir = run_ganc(ganc_bin, model, datasets[dataset], world, str(tmp_path))
    ref_dir = str(tmp_path / "ddp")
    if reducer == "global":
        reference.run(archive(model), datasets[dataset], world, STEPS, SEED, out_dir=ref_dir, global_batch=True)
    else:
        reference.run(archive(model), datasets[dataset], world, STEPS, SEED, out_dir=ref_dir, reducer=reducer)
    compare(model, got_dir, ref_dir)


def test_channels_last_matches_eager_ddp_channels_last(ganc_bin, datasets, tmp_path):
    """--memory-format channels_last (ganc's default on CUDA): NHWC weights, buffers and data,
    bucket slots with the weights' strides; against DDP on the same NHWC model."""
    got_dir = run_ganc(ganc_bin, "dcgan32", datasets["digits"], 2, str(tmp_path), "--memory-format",
                       "channels_last")
    ref_dir = str(tmp_path / "ddp")
    reference.run(archive("dcgan32"), datasets["digits"], 2, STEPS, SEED, out_dir=ref_dir, channels_last=True)
    compare("dcgan32", got_dir, ref_dir)
    final = ganc.load_checkpoint(os.path.join(got_dir, "params_final.pt"))
    convs = [t for t in final.values() if t.dim() == 4]
    assert all(t.is_contiguous(memory_format=torch.channels_last) for t in convs)
    assert any(not t.is_contiguous() for t in convs), "ganc did not train in the channels-last layout"


def test_branch_on_data_leaves_unreached_heads_alone(ganc_bin, datasets, tmp_path):
    """mlp_branch at 2 ranks: ganc plans the heads as conditional, and on the steps where no
    rank took a head, both ganc and eager DDP leave it without a gradient (and unstepped: the
    final parameters match); on the others it is all-reduced."""
    spec = ganc.load_spec(archive("mlp_branch"))
    got_dir = run_ganc(ganc_bin, "mlp_branch", datasets["ring"], 2, str(tmp_path))
    ref_dir = str(tmp_path / "ddp")
    reference.run(archive("mlp_branch"), datasets["ring"], 2, STEPS, SEED, out_dir=ref_dir)
    compare("mlp_branch", got_dir, ref_dir)
    heads = {"discriminator.head_a.weight", "discriminator.head_b.weight"}
    missing = [heads - set(got) for _, phase, got, _ in gradient_dumps(spec, STEPS, got_dir, ref_dir)
               if phase == "d"]
    assert any(missing), "no step left a head unreached: the case was not exercised"
    assert not all(missing), "a head was never reached"
    plan = subprocess.run([ganc_bin, "compile", archive("mlp_branch"), "--emit", "report"], capture_output=True,
                          text=True, check=True).stdout
    assert "reached only under a branch on data" in plan


def test_skipped_non_finite_steps_match_eager_ddp(ganc_bin, datasets, tmp_path):
    """non_finite: skip. Two samples of the ring data are beyond float32's range, so every D
    step whose batch (on either rank) holds one has inf/NaN all-reduced gradients: ganc skips
    exactly those optimizer steps, as an eager loop that checks the gradients does, and trains
    on through the others."""
    data = torch.load(datasets["ring"])
    data = (data["images"] if isinstance(data, dict) else data).clone()
    data[[5, 300]] *= 3e38
    huge = str(tmp_path / "ring_huge.pt")
    torch.save(data, huge)
    got_dir = run_ganc(ganc_bin, "mlp_skip", huge, 2, str(tmp_path))
    ref_dir = str(tmp_path / "ddp")
    reference.run(archive("mlp_skip"), huge, 2, STEPS, SEED, out_dir=ref_dir)
    compare("mlp_skip", got_dir, ref_dir)
    with open(os.path.join(tmp_path, "train", "timing.json")) as f:
        skipped = json.load(f)["skipped_steps"]
    assert 0 < skipped["d"] < STEPS and skipped["g"] == 0, skipped


def random_features(rng, base):
    """A ganc_spec 2 variant of `base` with training-step features drawn by `rng`: autocast to
    bfloat16 or float16 (model-wide or per phase), a dynamic loss scaler shared by some phases, accumulation
    of 2-3 micro-batches, phase intervals, Adam, AdamW or SGD (with momentum), weight decay,
    clipping by the 1-, 2- or max-norm, and learning-rate schedules."""
    spec = json.loads(json.dumps(base))
    spec["ganc_spec"] = 2
    if rng.random() < 0.4:
        spec["precision"] = rng.choice(["bfloat16", "float16"])
    if rng.random() < 0.4:
        spec["loss_scalers"] = {"amp": {"init_scale": rng.choice([2.0 ** 8, 2.0 ** 16]),
                                        "growth_interval": rng.choice([1, 2, 3])}}
    for phase in spec["phases"]:
        if rng.random() < 0.5:
            phase["accumulate"] = rng.choice([2, 3])
        if rng.random() < 0.3:
            phase["interval"] = rng.choice([2, 3])
        if "loss_scalers" in spec and rng.random() < 0.7:
            phase["loss_scaler"] = "amp"
        if rng.random() < 0.2:
            phase["precision"] = rng.choice(["float32", "bfloat16", "float16"])
    for optimizer in spec["optimizers"].values():
        optimizer["type"] = rng.choice(["adam", "adamw", "sgd"])
        if optimizer["type"] == "sgd":
            optimizer.pop("betas", None)
            optimizer["lr"] = 0.01
            if rng.random() < 0.6:
                optimizer["momentum"] = rng.choice([0.0, 0.9])
        if rng.random() < 0.4:
            optimizer["weight_decay"] = rng.choice([0.0, 1e-4, 1e-2])
        if rng.random() < 0.5:
            optimizer["clip_grad_norm"] = {"max_norm": rng.choice([0.01, 0.1, 1.0]),
                                           "norm_type": rng.choice([2.0, 1.0, "inf"])}
        if rng.random() < 0.4:
            optimizer["lr_schedule"] = rng.choice([{"type": "step", "step_size": 2, "gamma": 0.5},
                                                   {"type": "cosine", "t_max": 5},
                                                   {"type": "linear", "start_factor": 0.5, "total_iters": 3}])
    if not any(phase.get("loss_scaler") for phase in spec["phases"]):
        spec.pop("loss_scalers", None)  # one no phase uses is refused
    return spec


# Drawn once: together they hold every feature random_features draws (checked below), float16
# under a loss scaler among them. With bfloat16 the only low precision, the generator drew 46
# MLP GAN and 12 DCGAN-32 combinations; 10 MLP GAN and 11 DCGAN-32 ones more held float16
# autocast (8 of them under a loss scaler). Each was bitwise equal to eager DDP.
FEATURE_SEEDS = [1, 4, 7, 45]
# Draws on other models, each chosen for what the MLP GAN lacks (checked below): a penalty by
# double backward in a low-precision phase under a loss scaler, accumulating micro-batches,
# with clipping (WGAN-GP's critic phase, lazy R1's own phase, StyleGAN2's path length and R1,
# whose running mean is a float32 buffer), batch norm in float16 (DCGAN-32), and random ops
# inside a phase that accumulates 3 micro-batches, so that its data crosses an epoch (dropout and
# augmentation in DCGAN-32's D). Besides these, 9 WGAN-GP, 7 R1 GAN, 6 StyleGAN2, 3 DCGAN-32 and
# draws on 9 more zoo models (spectral norm, EMA, branches, two generators, labels, frozen
# layers, progressive stages) were bitwise equal to eager DDP.
FEATURE_DRAWS = [("mlp", "ring", seed, "ddp") for seed in FEATURE_SEEDS] + [
    ("wgan_gp", "ring", 59, "ddp"),
    ("r1gan", "ring", 7, "manual"),
    ("stylegan2", "digits", 14, {"Greg": "manual", "Dreg": "manual"}),
    ("dcgan32", "digits", 59, "ddp"),
    ("dcgan32_augment", "digits", 1, "ddp"),
]


# The convolutional draws run at a smaller batch: their bfloat16 and float16 convolutions are
# emulated on CPUs without AVX-512 and were the suite's dearest tests (StyleGAN2's 217 s,
# DCGAN-32's 83 s and 109 s at the zoo's batch). What they are chosen for (low precision under
# a loss scaler, accumulation, clipping, an epoch crossed) does not depend on the batch. For
# dcgan32_augment's D (3 micro-batches a step) to cross an epoch within STEPS steps at batch 8,
# it trains on the first SAMPLES digits. model -> (batch per rank, samples or None for all).
DRAW_SIZE = {"stylegan2": (8, None), "dcgan32": (4, None), "dcgan32_augment": (8, 400)}


def draw_spec(model, seed):
    """The random draw's spec for `model`, at its DRAW_SIZE batch."""
    import zoo
    spec = random_features(random.Random(seed), zoo.build(model)[1])
    if model in DRAW_SIZE:
        spec["batch_size"] = DRAW_SIZE[model][0]
    return spec


def draw_data(datasets, dataset, model, out):
    """The data a draw trains on: the data set, or its first DRAW_SIZE samples."""
    samples = DRAW_SIZE.get(model, (None, None))[1]
    if samples is None:
        return datasets[dataset]
    data = torch.load(datasets[dataset])
    path = os.path.join(out, f"{dataset}_{samples}.pt")
    torch.save({k: v[:samples] for k, v in data.items()} if isinstance(data, dict) else data[:samples], path)
    return path


def low_precision(spec, phase):
    return phase.get("precision", spec.get("precision", "float32")) in ("bfloat16", "float16")


def test_the_random_combinations_hold_every_feature(datasets, tmp_path):
    import zoo
    specs = [random_features(random.Random(seed), zoo.build("mlp")[1]) for seed in FEATURE_SEEDS]
    phases = [phase for spec in specs for phase in spec["phases"]]
    optimizers = [o for spec in specs for o in spec["optimizers"].values()]
    precisions = {spec.get("precision") for spec in specs} | {phase.get("precision") for phase in phases}
    assert {"bfloat16", "float16"} <= precisions, precisions
    assert any(phase.get("loss_scaler") and phase.get("precision", spec.get("precision")) == "float16"
               for spec in specs for phase in spec["phases"])
    assert any(phase.get("loss_scaler") for phase in phases)
    assert any(phase.get("accumulate", 1) > 1 and phase.get("interval", 1) > 1 for phase in phases)
    assert {o["type"] for o in optimizers} == {"adam", "adamw", "sgd"}
    assert any(o.get("momentum") for o in optimizers) and any(o.get("weight_decay") for o in optimizers)
    assert {o["clip_grad_norm"]["norm_type"] for o in optimizers if "clip_grad_norm" in o} == {1.0, 2.0, "inf"}
    assert {o["lr_schedule"]["type"] for o in optimizers if "lr_schedule" in o} == {"step", "cosine", "linear"}
    # The other models' draws: the phases named here run low precision under a loss scaler,
    # the first of them accumulating; the model clips (StyleGAN2: both regularisers instead).
    chosen_for = {"wgan_gp": ["d"], "r1gan": ["dreg"], "stylegan2": ["Greg", "Dreg"], "dcgan32": ["d"],
                  "dcgan32_augment": ["d"]}
    for model, dataset, seed, _ in FEATURE_DRAWS[len(FEATURE_SEEDS):]:
        spec = draw_spec(model, seed)
        phases = {phase["name"]: phase for phase in spec["phases"]}
        names = chosen_for[model]
        assert all(low_precision(spec, phases[n]) and phases[n].get("loss_scaler") for n in names), (model, spec)
        assert phases[names[0]].get("accumulate", 1) > 1, (model, spec)
        assert model == "stylegan2" or any("clip_grad_norm" in o for o in spec["optimizers"].values()), (model, spec)
        if model == "dcgan32_augment":
            # Over STEPS steps D reads more batches than a rank's epoch of the digits holds.
            d = phases["d"]
            data = torch.load(draw_data(datasets, dataset, model, str(tmp_path)))
            per_epoch = (len(data["images"]) // 2) // spec["batch_size"]
            assert d.get("interval", 1) == 1 and STEPS * d["accumulate"] > per_epoch, (spec, per_epoch)


@pytest.mark.parametrize("model,dataset,seed,reducer", FEATURE_DRAWS)
def test_random_feature_combinations_match_eager_ddp(ganc_bin, datasets, tmp_path, model, dataset, seed, reducer):
    """Training-step features in combinations no hand-written case holds, at 2 ranks: every
    all-reduced gradient, final parameter and loss scaler bitwise equal to eager DDP doing the
    same with torch.autocast, GradScaler, no_sync(), clip_grad_norm_ and torch's optimizers
    and schedulers."""
    import zoo
    gan, _ = zoo.build(model)
    spec = draw_spec(model, seed)
    path = str(tmp_path / f"{model}_features.pt")
    ganc.export(gan, path, spec)
    data = draw_data(datasets, dataset, model, str(tmp_path))
    got_dir = run_ganc(ganc_bin, f"{model}_features", data, 2, str(tmp_path), path=path)
    ref_dir = str(tmp_path / "ddp")
    reference.run(path, data, 2, STEPS, SEED, out_dir=ref_dir, reducer=reducer)
    compare_bitwise(path, got_dir, ref_dir)


def test_synchronised_batch_norm_at_one_rank_is_batch_norm(ganc_bin, datasets, tmp_path):
    """At world size 1 ganc::sync_batch_norm is batch norm itself, as torch.nn.SyncBatchNorm
    falls back to F.batch_norm there: dcgan32_all (G's batch norms synchronised, under
    bfloat16 autocast, with a loss scaler, D accumulating and G clipped) trains bit for bit like
    eager DDP with the model's BatchNorm at one rank."""
    assert "ganc::sync_batch_norm(" in subprocess.run(
        [ganc_bin, "compile", archive("dcgan32_all"), "--emit", "ir"], capture_output=True, text=True,
        check=True).stdout
    got_dir = run_ganc(ganc_bin, "dcgan32_all", datasets["digits"], 1, str(tmp_path))
    ref_dir = str(tmp_path / "ddp")
    reference.run(archive("dcgan32_all"), datasets["digits"], 1, STEPS, SEED, out_dir=ref_dir)
    compare_bitwise(archive("dcgan32_all"), got_dir, ref_dir)


def test_gradient_penalty_through_synchronised_batch_norm(ganc_bin, datasets, tmp_path):
    """Lazy R1 through a discriminator whose batch norm is synchronised (probe_r1_syncbn): at
    one rank, where ganc::sync_batch_norm is batch norm, the penalty has batch norm's double
    backward and trains bit for bit like eager DDP (R1 all-reduced by hand: DDP fails on lazy
    R1); at two ranks the op has none, as torch.nn.SyncBatchNorm has none, and the run stops
    at the penalty's first step with that reason."""
    model = "probe_r1_syncbn"
    got_dir = run_ganc(ganc_bin, model, datasets["ring"], 1, str(tmp_path))
    ref_dir = str(tmp_path / "ddp")
    reference.run(archive(model), datasets["ring"], 1, STEPS, SEED, out_dir=ref_dir, reducer={"dreg": "manual"})
    compare_bitwise(archive(model), got_dir, ref_dir)
    result = subprocess.run([ganc_bin, "run", "--nproc", "2", os.path.join(tmp_path, "plan.ganc"), "--model",
                             archive(model), "--data", datasets["ring"], "--steps", "2",
                             "--out", str(tmp_path / "two"), "--sample-every", "0", "--checkpoint-every", "0"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert ("step 0: phase 'dreg': RuntimeError: ganc::sync_batch_norm has no double backward at more than "
            "one rank") in result.stderr, result.stderr


def compare_bitwise(path, got_dir, ref_dir):
    """Every all-reduced gradient, final parameter and loss scaler of the run in `got_dir`
    equal to the reference's, bit for bit."""
    spec = ganc.load_spec(path)
    compared = 0
    for step, phase, got, ref in gradient_dumps(spec, STEPS, got_dir, ref_dir):
        for p in ref:
            # Exactly (no tolerance), NaN equal to NaN: a float16 step that overflowed leaves
            # inf and NaN in the gradients on both sides (and is skipped).
            torch.testing.assert_close(got[p], ref[p], rtol=0, atol=0, equal_nan=True,
                                       msg=f"{json.dumps(spec)}: step {step}, phase {phase}: {p}")
            compared += 1
    assert compared > 0
    got = ganc.load_checkpoint(os.path.join(got_dir, "params_final.pt"))
    ref = torch.load(os.path.join(ref_dir, "params_final.pt"))
    assert set(got) == set(ref) and all(torch.equal(got[p], ref[p]) for p in ref), json.dumps(spec)
    if "loss_scalers" in spec:
        got = ganc.load_checkpoint(os.path.join(got_dir, "loss_scalers_final.pt"))
        ref = torch.load(os.path.join(ref_dir, "loss_scalers_final.pt"))
        assert got == ref, f"{json.dumps(spec)}: loss scalers: ganc {got}, GradScaler {ref}"


def compare(model, got_dir, ref_dir, path=None):
    spec = ganc.load_spec(path or archive(model))
    compared = 0
    for step, phase, got, ref in gradient_dumps(spec, STEPS, got_dir, ref_dir):
        for p in ref:
            err = relative_error(got[p], ref[p])
            assert err <= 1e-5, f"step {step}, phase {phase}: gradient of {p} differs by {err:.2e}"
            compared += 1
    assert compared > 0
    check_clipping(spec, got_dir, ref_dir)
    check_loss_scaling(spec, got_dir, ref_dir, overflows=model in OVERFLOWING)
    check_grad_norms(os.path.join(os.path.dirname(got_dir), "train"), ref_dir)
    got = ganc.load_checkpoint(os.path.join(got_dir, "params_final.pt"))
    ref = torch.load(os.path.join(ref_dir, "params_final.pt"))
    assert set(got) == set(ref)
    for p in ref:
        err = relative_error(got[p].double(), ref[p].double())
        assert err <= 1e-4, f"after {STEPS} steps {p} differs by {err:.2e}"


def check_grad_norms(train_dir, ref_dir):
    """stats.jsonl's GradNorm/<phase> (the all-reduced gradients' L2 norm, unscaled, before
    clipping; mean and count over the log interval's finite values and every rank) equal to the
    eager reference's norms taken where torch.nn.utils.clip_grad_norm_ would see them."""
    stats = os.path.join(train_dir, "stats.jsonl")
    if not os.path.exists(stats):
        return
    with open(stats) as f:
        last = [json.loads(line) for line in f][-1]
    world = json.load(open(os.path.join(train_dir, "run.json")))["world_size"]
    reference = json.load(open(os.path.join(ref_dir, "grad_norms.json")))
    assert reference
    for phase, norms in reference.items():
        finite = [n for n in norms if n == n and abs(n) != float("inf")]
        got = last.get(f"GradNorm/{phase}")
        assert (got is None) == (not finite), (phase, got, norms)
        if finite:
            mean = sum(finite) / len(finite)
            assert got["num"] == len(finite) * world, (phase, got, norms)
            assert abs(got["mean"] - mean) <= 1e-4 * mean, f"GradNorm/{phase}: ganc {got['mean']}, eager {mean}"


def check_clipping(spec, got_dir, ref_dir):
    """With clip_grad_norm, every clipped optimizer group's gradient norm is at most max_norm,
    and equal to it on some step (the bound was active, so parity covered the clipping)."""
    clipped = {sub: opt["clip_grad_norm"] for sub, opt in spec["optimizers"].items()
               if "clip_grad_norm" in opt}
    if not clipped:
        return
    active = set()
    for _, _, got, _ in gradient_dumps(spec, STEPS, got_dir, ref_dir):
        for sub, clip in clipped.items():
            grads = [g for name, g in got.items()
                     if any(name == p or name.startswith(p + ".") for p in spec["optimizers"][sub].get("params", [sub]))]
            if not grads:
                continue
            p = float(clip.get("norm_type", 2.0))
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, p) for g in grads]), p).item()
            assert norm <= clip["max_norm"] * (1 + 1e-4), f"{sub}: gradient norm {norm} over {clip['max_norm']}"
            if abs(norm - clip["max_norm"]) <= 1e-3 * clip["max_norm"]:
                active.add(sub)
    assert active == set(clipped), f"clipping never took effect for {set(clipped) - active}"


def check_loss_scaling(spec, got_dir, ref_dir, overflows):
    """With loss scalers: ganc's final scales and growth trackers equal GradScaler's; with
    `overflows`, the run also covered a skipped step (an overflowed gradient) and a scale
    below the initial one."""
    scalers = spec.get("loss_scalers", {})
    if not scalers:
        return
    got = ganc.load_checkpoint(os.path.join(got_dir, "loss_scalers_final.pt"))
    ref = torch.load(os.path.join(ref_dir, "loss_scalers_final.pt"))
    assert got == ref, f"loss scalers: ganc {got}, GradScaler {ref}"
    if not overflows:
        return
    for name, cfg in scalers.items():
        assert ref[name]["scale"] < cfg["init_scale"], f"scaler {name} never backed off"
    overflowed = any(not torch.isfinite(g).all() for _, _, got_grads, _ in
                     gradient_dumps(spec, STEPS, got_dir, ref_dir) for g in got_grads.values())
    assert overflowed, "no step overflowed: the skip was not exercised"


def test_the_python_class_reference_trains_like_the_archive(datasets, tmp_path):
    """The reference the GPU test of synchronised batch norm uses (torch.nn.SyncBatchNorm
    refuses CPU tensors): the zoo's Python class, run eagerly with the archive's weights,
    trains bit for bit like the archive at 2 ranks. A spec that synchronises batch norm has no
    per-rank reference in its archive alone: the oracle refuses to make one."""
    import functools
    import zoo
    runs = {}
    for side, model in (("archive", None), ("python", functools.partial(zoo.module, "dcgan32"))):
        runs[side] = str(tmp_path / side)
        reference.run(archive("dcgan32"), datasets["digits"], 2, 4, SEED, out_dir=runs[side], eager_model=model)
    compared = 0
    for step, phase, python, scripted in gradient_dumps(ganc.load_spec(archive("dcgan32")), 4, runs["python"],
                                                        runs["archive"], torch.load):
        for p in scripted:
            assert torch.equal(python[p], scripted[p]), f"step {step}, phase {phase}: {p}"
            compared += 1
    assert compared > 0
    python, scripted = (torch.load(os.path.join(runs[s], "params_final.pt")) for s in ("python", "archive"))
    assert set(python) == set(scripted) and all(torch.equal(python[p], scripted[p]) for p in scripted)
    with pytest.raises(ValueError, match="'sync_batch_norm'.*global_batch=True or eager_model="):
        reference.run(archive("dcgan32_syncbn_f64"), datasets["digits"], 2, 1, SEED, out_dir=str(tmp_path / "x"))


# torch.optim's other optimizers and options, and WGAN's weight clipping: (discriminator's
# group, generator's group) on the MLP GAN.
OPTIMIZER_PAIRS = {
    "rmsprop_clamp": ({"type": "rmsprop", "lr": 5e-4, "clamp_weights": 0.05},
                      {"type": "rmsprop", "lr": 5e-4, "alpha": 0.9, "momentum": 0.5, "centered": True,
                       "weight_decay": 1e-4}),
    "nesterov_amsgrad": ({"type": "sgd", "lr": 0.01, "momentum": 0.9, "nesterov": True},
                         {"type": "adam", "lr": 1e-3, "betas": [0.5, 0.999], "amsgrad": True}),
    "dampening_adamw_amsgrad": ({"type": "adamw", "lr": 1e-3, "amsgrad": True, "weight_decay": 1e-2},
                                {"type": "sgd", "lr": 0.01, "momentum": 0.9, "dampening": 0.1,
                                 "weight_decay": 1e-4}),
}


def optimizer_archive(tmp_path, pair):
    import zoo
    gan, spec = zoo.build("mlp")
    d, g = OPTIMIZER_PAIRS[pair]
    spec = dict(spec, ganc_spec=2, optimizers={"discriminator": d, "generator": g})
    path = str(tmp_path / f"{pair}.pt")
    ganc.export(gan, path, spec, verbose=False)
    return path


@pytest.mark.parametrize("pair", sorted(OPTIMIZER_PAIRS))
def test_optimizers_and_the_weight_clamp_equal_torch_optim(ganc_bin, datasets, tmp_path, pair):
    """RMSprop (momentum, centred, weight decay), SGD with Nesterov momentum or dampening,
    Adam and AdamW with AMSGrad, and `clamp_weights` after the critic's step (WGAN's
    `p.data.clamp_(-c, c)`): bit for bit torch.optim under eager DDP, 2 ranks, every gradient
    and the final parameters."""
    path = optimizer_archive(tmp_path, pair)
    got_dir = run_ganc(ganc_bin, None, datasets["ring"], 2, str(tmp_path), path=path)
    ref_dir = str(tmp_path / "ddp")
    reference.run(path, datasets["ring"], 2, STEPS, SEED, out_dir=ref_dir)
    compare_bitwise(path, got_dir, ref_dir)
    clamp = OPTIMIZER_PAIRS[pair][0].get("clamp_weights")
    if clamp:
        final = ganc.load_checkpoint(os.path.join(got_dir, "params_final.pt"))
        critic = [t for n, t in final.items() if n.startswith("discriminator.")]
        limit = torch.tensor(clamp).item()  # 0.05 as float32 holds it
        assert all(t.abs().max().item() <= limit for t in critic)
        assert any(t.abs().max().item() == limit for t in critic)  # the clamp acted


def test_the_new_optimizer_states_resume_exactly(ganc_bin, datasets, tmp_path):
    """RMSprop's square_avg, grad_avg and momentum buffer and AMSGrad's max_exp_avg_sq go into
    the checkpoint and come back: a run stopped at step 4 and resumed ends bit for bit where
    a straight run does."""
    held = set()
    for model in (optimizer_archive(tmp_path, "rmsprop_clamp"), optimizer_archive(tmp_path, "nesterov_amsgrad")):
        plan = model + ".plan"
        subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
        common = [ganc_bin, "train", plan, "--model", model, "--data", datasets["ring"], "--seed", str(SEED),
                  "--sample-every", "0", "--tensorboard", "off"]
        subprocess.run(common + ["--steps", "9", "--out", model + ".straight", "--checkpoint-every", "9"],
                       check=True, capture_output=True)
        subprocess.run(common + ["--steps", "4", "--out", model + ".resumed", "--checkpoint-every", "4"],
                       check=True, capture_output=True)
        subprocess.run(common + ["--steps", "9", "--out", model + ".resumed", "--checkpoint-every", "9",
                                 "--resume", "auto"], check=True, capture_output=True)
        straight = ganc.load_checkpoint(model + ".straight/checkpoint.pt")
        resumed = ganc.load_checkpoint(model + ".resumed/checkpoint.pt")
        assert straight["step"] == resumed["step"] == 9
        for key in ("discriminator", "generator", "optimizers"):
            assert_equal(straight[key], resumed[key], key)
        states = {group: next(iter(o["state"].values())) for group, o in straight["optimizers"].items()}
        held.update(key for state in states.values() for key in state)
    assert {"square_avg", "grad_avg", "momentum_buffer", "max_exp_avg_sq"} <= held, held
