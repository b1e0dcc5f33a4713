"""Sharded optimizer state (`zero`): parity, consolidated checkpoints, bad input.

Parity: with `--zero 1` and `--zero 2`, every all-reduced gradient (gathered from the ranks'
pieces) and every parameter after STEPS steps must equal the unsharded ganc run within 1e-6
relative, and eager DDP with ZeroRedundancyOptimizer (run in the same test) as closely as the
unsharded parity suite asks of eager DDP. Three float32 addends sum in an order set by
where a value sits in the buffer (Gloo's ring), and the sharded layout puts them elsewhere;
as in the parity suite, the 3-rank DCGAN and StyleGAN2 comparisons run in float64.
"""
import os
import subprocess

import pytest
import torch

import ganc
from ganc import reference
from conftest import archive, compile_plan, gradient_dumps
from test_parity import relative_error

STEPS = 10
SEED = 7
# (archive, dataset, world, eager reference reducer[, steps: STEPS if not given])
CORE = [
    ("mlp", "ring", 2, "ddp"),
    ("mlp", "ring", 3, "ddp"),
    ("dcgan32", "digits", 2, "ddp"),
    ("dcgan32_f64", "digits", 3, "ddp"),
    ("stylegan2", "digits", 2, {"Greg": "manual", "Dreg": "manual"}),
    # 5 steps (every phase runs, both regularisers at step 0, path length again at 4): the
    # suite's dearest case at 10 (64 s), and 3-rank shard layouts are the other cases' too.
    ("stylegan2_f64", "digits", 3, {"Greg": "manual", "Dreg": "manual"}, 5),
]
# Training-step features whose arithmetic sharding changes, at 2 ranks with zero 2: norms
# and found-inf flags combined across ranks, unreached branches, frozen and separately
# optimised parts, SGD, accumulation, stages, EMA. A 2-norm summed from the ranks' pieces
# differs in the last bit from one over whole gradients, and clipping to far below the
# gradients' norm puts Adam where that shows (its epsilon regime): clipping is compared in
# float64 (the max norm, exact in any order, is clipped there too).
FEATURES = ["dcgan32_clip_f64", "dcgan32_scaled", "mlp_branch", "dcgan32_freezed", "mlp_temperature",
            "dcgan32_accumulate", "pggan_quick", "mlp_ema", "dcgan32_all_f64"]
DATASET = {"mlp": "ring", "dcgan32": "digits", "pggan": "digits", "stylegan2": "digits"}


def dataset_of(model):
    return DATASET[model.split("_")[0]]


def train(ganc_bin, model, data, world, out, zero, steps=STEPS, *extra):
    """`ganc run` with gradient dumps; returns the dump directory."""
    plan = os.path.join(out, "plan.ganc")
    if not os.path.exists(plan):
        subprocess.run([ganc_bin, "compile", archive(model), "-o", plan], check=True,
                       stderr=subprocess.DEVNULL)
    dumps = os.path.join(out, f"dumps-zero{zero}")
    result = subprocess.run(
        [ganc_bin, "run", "--nproc", str(world), plan, "--model", archive(model), "--data", data,
         "--steps", str(steps), "--seed", str(SEED), "--out", os.path.join(out, f"run-zero{zero}"),
         "--sample-every", "0", "--checkpoint-every", "0", "--log-every", str(steps),
         "--tensorboard", "off", "--dump-grads", dumps, "--zero", str(zero), *extra],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    if zero and world > 1:
        assert f"optimizer state sharded: zero {zero}" in result.stdout
    return dumps


def assert_same_run(model, got_dir, ref_dir, tolerance, steps=STEPS):
    spec = ganc.load_spec(archive(model))
    compared = 0
    for step, phase, got, ref in gradient_dumps(spec, steps, got_dir, ref_dir, ganc.load_checkpoint):
        for p in ref:
            err = relative_error(got[p], ref[p])
            assert err <= tolerance[0], f"step {step}, phase {phase}: gradient of {p} differs by {err:.2e}"
            compared += 1
    assert compared > 0
    got = ganc.load_checkpoint(os.path.join(got_dir, "params_final.pt"))
    ref = ganc.load_checkpoint(os.path.join(ref_dir, "params_final.pt"))
    assert set(got) == set(ref)
    for p in ref:
        err = relative_error(got[p].double(), ref[p].double())
        assert err <= tolerance[1], f"after {steps} steps {p} differs by {err:.2e}"


@pytest.mark.parametrize("model,dataset,world,reducer,steps",
                         [case + (STEPS,) * (5 - len(case)) for case in CORE])
def test_sharded_runs_equal_unsharded_and_eager_zero(ganc_bin, datasets, tmp_path, model, dataset,
                                                     world, reducer, steps):
    data = datasets[dataset]
    unsharded = train(ganc_bin, model, data, world, str(tmp_path), 0, steps)
    ref_dir = str(tmp_path / "eager")
    reference.run(archive(model), data, world, steps, SEED, out_dir=ref_dir, reducer=reducer, zero=True)
    for zero in (1, 2):
        sharded = train(ganc_bin, model, data, world, str(tmp_path), zero, steps)
        assert_same_run(model, sharded, unsharded, (1e-6, 1e-6), steps)
        assert_same_run(model, sharded, ref_dir, (1e-5, 1e-4), steps)


@pytest.mark.parametrize("model", FEATURES)
def test_sharding_keeps_training_step_features(ganc_bin, datasets, tmp_path, model):
    data = datasets[dataset_of(model)]
    unsharded = train(ganc_bin, model, data, 2, str(tmp_path), 0)
    sharded = train(ganc_bin, model, data, 2, str(tmp_path), 2)
    assert_same_run(model, sharded, unsharded, (1e-6, 1e-6))


def optimizer_state(path):
    return torch.load(path, weights_only=False)["optimizers"]


def assert_same_optimizer_state(gathered, whole):
    """A sharded checkpoint's optimizer state against an unsharded one's: the same groups,
    parameters and kinds of state, each of the same shape and within 1e-6."""
    assert set(whole) == set(gathered)
    for group in whole:
        assert set(whole[group]["state"]) == set(gathered[group]["state"])
        for name, state in whole[group]["state"].items():
            for kind, value in state.items():
                got = gathered[group]["state"][name][kind]
                assert got.shape == value.shape, (group, name, kind)
                assert relative_error(got.double(), value.double()) <= 1e-6, (group, name, kind)


def test_checkpoints_are_whole_and_resume_on_any_world_size(ganc_bin, datasets, tmp_path):
    """A sharded run's checkpoint holds the whole optimizer state, as an unsharded run's does
    (torch.load reads it); it resumes unsharded on the same ranks exactly, and on 3 ranks and
    on 1 (sharded or not) it trains on."""
    model, data = "dcgan32", datasets["digits"]
    plan = str(tmp_path / "plan.ganc")
    subprocess.run([ganc_bin, "compile", archive(model), "-o", plan, "--zero", "2", "--ranks", "2"],
                   check=True, stderr=subprocess.DEVNULL)

    def run(world, out, steps, *extra):
        result = subprocess.run(
            [ganc_bin, "run", "--nproc", str(world), plan, "--model", archive(model), "--data", data,
             "--steps", str(steps), "--seed", str(SEED), "--out", str(tmp_path / out),
             "--sample-every", "0", "--checkpoint-every", "3", "--log-every", "100",
             "--tensorboard", "off", "--keep-checkpoints", "5", *extra],
            capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        return result

    sharded = run(2, "sharded", 6)
    assert "optimizer state sharded: zero 2" in sharded.stdout
    run(2, "unsharded", 6, "--zero", "0")
    # Without --dump-grads the all-gather reuses the gradient shards' memory: the weights
    # are still the unsharded run's.
    for step in ("0000003", "0000006"):
        want = torch.load(tmp_path / "unsharded" / f"checkpoint-{step}.pt", weights_only=False)
        got = torch.load(tmp_path / "sharded" / f"checkpoint-{step}.pt", weights_only=False)
        for sub in ("generator", "discriminator"):
            for name, value in want[sub].items():
                assert relative_error(got[sub][name].double(), value.double()) <= 1e-6, (step, name)
    assert_same_optimizer_state(optimizer_state(tmp_path / "sharded" / "checkpoint-0000003.pt"),
                                optimizer_state(tmp_path / "unsharded" / "checkpoint-0000003.pt"))

    # Unsharded from the sharded checkpoint, on the same 2 ranks: the same run.
    first = str(tmp_path / "sharded" / "checkpoint-0000003.pt")
    run(2, "resumed", 6, "--resume", first, "--zero", "0")
    expected = torch.load(tmp_path / "sharded" / "checkpoint.pt", weights_only=False)
    resumed = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)
    for sub in ("generator", "discriminator"):
        for name, value in expected[sub].items():
            assert relative_error(resumed[sub][name].double(), value.double()) <= 1e-6, name
    # On 3 ranks, sharded (the shards re-planned), and on 1 rank (nothing to shard).
    three = run(3, "three", 9, "--resume", first)
    assert "planning them for 3" in three.stdout and "written by 2 ranks" in three.stdout
    assert torch.load(tmp_path / "three" / "checkpoint.pt", weights_only=False)["step"] == 9
    one = run(1, "one", 9, "--resume", first)
    assert "with one rank: there is nothing to shard" in one.stderr
    state = optimizer_state(tmp_path / "one" / "checkpoint.pt")
    steps = {float(s["step"]) for g in state.values() for s in g["state"].values()}
    assert steps == {9.0}


def test_explain_shows_the_shards(ganc_bin, tmp_path):
    plan = str(tmp_path / "plan.ganc")
    subprocess.run([ganc_bin, "compile", archive("dcgan32"), "-o", plan, "--zero", "2", "--ranks", "4"],
                   check=True, stderr=subprocess.DEVNULL)
    report = subprocess.run([ganc_bin, "explain", plan], capture_output=True, text=True, check=True).stdout
    assert "sharded optimizer state (zero 2) over 4 ranks" in report
    assert "reduce-scattered" in report and "all-gathered" in report
    import json
    facts = json.loads(subprocess.run([ganc_bin, "explain", plan, "--json"], capture_output=True,
                                      text=True, check=True).stdout)
    assert facts["zero"] == 2 and facts["shard_ranks"] == 4
    moments = facts["moment_bytes"]
    # A quarter of the state per rank, plus at most one element and alignment per parameter.
    assert moments["unsharded"] / 4 <= moments["per_rank"] <= moments["unsharded"] / 4 + 4 * len(facts["parameters"])
    for phase in facts["phases"]:
        for bucket in phase["buckets"]:
            assert bucket["shard_bytes"] % 64 == 0
            assert bucket["bytes"] <= 4 * bucket["shard_bytes"] <= bucket["bytes"] + 4 * 64 * (len(bucket["slots"]) + 1)


def test_sharded_state_is_a_world_size_fraction(ganc_bin, datasets, tmp_path):
    """summary.json: optimizer-state bytes per rank are half at 2 ranks (plus at most a
    parameter's rounding); the gradient buffers, shared by the phases when sharded, are the
    largest phase's (G's) instead of every phase's. A profile of a sharded run says so, and
    `ganc simulate` refuses it (its optimizer time is one shard's)."""
    import json
    sizes = {}
    for zero in (0, 1, 2):
        out = tmp_path / f"zero{zero}"
        subprocess.run([ganc_bin, "run", "--nproc", "2", compile_plan(ganc_bin, "dcgan32", str(tmp_path)),
                        "--model", archive("dcgan32"), "--data", datasets["digits"], "--steps", "2",
                        "--out", str(out), "--checkpoint-every", "0", "--sample-every", "0",
                        "--tensorboard", "off", "--zero", str(zero), "--profile", str(out / "profile.json")],
                       check=True, capture_output=True)
        with open(out / "summary.json") as f:
            sizes[zero] = json.load(f)
        assert json.load(open(out / "profile.json"))["zero"] == zero
        simulated = subprocess.run([ganc_bin, "simulate", str(tmp_path / "dcgan32.plan"), "--profile",
                                    str(out / "profile.json"), "--gpus", "1,8"], capture_output=True, text=True)
        if zero:
            assert simulated.returncode == 2 and "was measured sharded" in simulated.stderr
        else:
            assert simulated.returncode == 0, simulated.stderr
    facts = json.loads(subprocess.run([ganc_bin, "explain", str(tmp_path / "dcgan32.plan"), "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    phase_bytes = {p["name"]: sum(b["bytes"] for b in p["buckets"]) for p in facts["phases"]}
    whole = sizes[0]["optimizer_state_bytes"]
    assert sizes[0]["gradient_buffer_bytes"] == sum(phase_bytes.values())
    for zero in (1, 2):
        assert whole / 2 <= sizes[zero]["optimizer_state_bytes"] <= whole / 2 + 64 * 8
        assert max(phase_bytes.values()) <= sizes[zero]["gradient_buffer_bytes"] \
            <= max(phase_bytes.values()) + 2 * 64 * 16


@pytest.mark.parametrize("args,mentions", [
    # One declaration of each flag (tools/CommonOptions.h): compile and train say the same.
    (["compile", "MODEL", "-o", "PLAN", "--zero", "3"], "--zero takes 0, 1 or 2, not '3'"),
    (["compile", "MODEL", "-o", "PLAN", "--ranks", "0"], "--ranks takes a world size from 1 to 16777216, not '0'"),
    (["train", "PLAN", "--model", "MODEL", "--zero", "two"], "--zero takes 0, 1 or 2, not 'two'"),
])
def test_bad_zero_options_are_one_line(ganc_bin, tmp_path, args, mentions):
    plan = str(tmp_path / "plan.ganc")
    subprocess.run([ganc_bin, "compile", archive("mlp"), "-o", plan], check=True, stderr=subprocess.DEVNULL)
    args = [a.replace("MODEL", archive("mlp")).replace("PLAN", plan) for a in args]
    if args[0] == "compile":
        args[args.index("-o") + 1] = str(tmp_path / "other.ganc")
    result = subprocess.run([ganc_bin, *args], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and mentions in lines[0], result.stderr


def test_python_api_takes_the_stage(ganc_bin, datasets, tmp_path):
    plan = ganc.compile(archive("mlp"), str(tmp_path / "mlp.plan"), zero=2, ranks=2)
    assert "zero 2 ranks 2" in open(plan.path).read()
    summary = ganc.train(plan, data=datasets["ring"], nproc=2, out=str(tmp_path / "run"), steps=2,
                         zero=1, tensorboard="off", quiet=True)
    assert summary["zero"] == 1 and summary["world_size"] == 2
