"""ganc as a PyTorch practitioner uses it: the Python API, the run directory (refusal to
overwrite, --resume auto, rotated checkpoints, hyper-parameter overrides), stats.jsonl,
TensorBoard events read back with tensorboard's reader, `ganc plot`, torchrun and SLURM;
scripts/gpu_check.sh's prebuilt binaries and refusals on a machine without a GPU."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, archive, compile_plan, train_args

import ganc


def run_ganc(ganc_bin, *args, env=None):
    return subprocess.run([ganc_bin, *args], capture_output=True, text=True, env=env)


def test_python_api_compiles_explains_and_trains(ganc_bin, datasets, tmp_path):
    """ganc.compile gives the plan's analysis as Python data; ganc.train trains with local
    ranks and returns the run's summary; the run equals the same `ganc run` from the shell."""
    plan = ganc.compile(archive("mlp"), str(tmp_path / "mlp.plan"))
    assert plan.phases == ["d", "g"]
    names = [n for n, _ in torch.jit.load(archive("mlp")).named_parameters()]
    assert plan.used("d") and set(plan.used("d")) == {n for n in names if n.startswith("discriminator.")}
    assert set(plan.used("g")) == {n for n in names if n.startswith("generator.")}
    assert sorted(sum(plan.buckets("g"), [])) == sorted(plan.used("g"))
    d_bytes = 4 * sum(p.numel() for n, p in torch.jit.load(archive("mlp")).named_parameters()
                      if n.startswith("discriminator."))
    assert sum(s["bytes"] for b in plan.phase("d")["buckets"] for s in b["slots"]) == d_bytes
    assert d_bytes <= plan.bytes_per_step("d") < d_bytes + 64 * len(plan.used("d"))  # slots are aligned
    assert "phase d: method phase_d" in plan.explain()
    assert ganc.Plan.load(plan.path).data == plan.data

    api_out = str(tmp_path / "api")
    summary = ganc.train(plan, data=datasets["ring"], nproc=2, steps=20, out=api_out, log_every=10,
                         sample_every=0, quiet=True)
    assert summary["steps"] == 20 and summary["world_size"] == 2 and set(summary["losses"]) == {"d", "g"}
    assert summary["checkpoint"] == os.path.join(api_out, "checkpoint.pt")
    # Images are counted once over both ranks, in the summary and in kimg (not once per rank more).
    batch = json.load(open(os.path.join(api_out, "run.json")))["spec"]["batch_size"]
    assert summary["images"] == 20 * batch * 2, summary
    with open(os.path.join(api_out, "stats.jsonl")) as f:
        kimg = [json.loads(line)["Progress/kimg"] for line in f]
    assert kimg == [10 * batch * 2 / 1000, 20 * batch * 2 / 1000]
    cli_out = str(tmp_path / "cli")
    subprocess.run([ganc_bin, "run", "--nproc", "2", *train_args(plan.path, "mlp", datasets["ring"], cli_out, 20,
                                                                  "--log-every", "10")], check=True,
                   capture_output=True)
    a = ganc.load_checkpoint(os.path.join(api_out, "checkpoint.pt"))
    b = ganc.load_checkpoint(os.path.join(cli_out, "checkpoint.pt"))
    for owner in ("generator", "discriminator"):
        for k in a[owner]:
            assert torch.equal(a[owner][k], b[owner][k]), k

    # A tensor in memory is data too, alone or as {"images": ...}; anything else is a TypeError
    # saying what data= takes; a failure raises with the driver's line and exit code.
    points = torch.load(datasets["ring"])
    points = points["images"] if isinstance(points, dict) else points
    ganc.train(plan, data={"images": points}, steps=2, out=str(tmp_path / "dict"), quiet=True)
    with pytest.raises(TypeError, match=r"data= takes a path .*, not list"):
        ganc.train(plan, data=[1, 2, 3], steps=2, out=str(tmp_path / "list"), quiet=True)
    ganc.train(plan, data=points, steps=2, out=str(tmp_path / "mem"), quiet=True)
    with pytest.raises(ganc.GancError) as e:
        ganc.train(plan, data=datasets["ring"], steps=2, out=str(tmp_path / "mem"), quiet=True)
    assert e.value.exit_code == 2 and "holds a run" in e.value.message


def test_stats_average_over_ranks_and_interval_and_reach_tensorboard(ganc_bin, datasets, tmp_path):
    """stats.jsonl's Loss/<phase> is the mean over the log interval (one rank: the mean of
    loss_history.csv's rows of the interval) and over every rank (num counts both); the
    TensorBoard event file holds the same scalars and the sample grids; ganc plot draws them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    one = tmp_path / "one"
    subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(one), 12, "--log-every", "4",
                                                   "--sample-every", "6")], check=True, capture_output=True)
    rows = [line.split(",") for line in (one / "loss_history.csv").read_text().splitlines()[1:]]
    stats = [json.loads(line) for line in (one / "stats.jsonl").read_text().splitlines()]
    assert [s["step"] for s in stats] == [4, 8, 12]
    for record in stats:
        for phase in ("d", "g"):
            losses = [float(r[2]) for r in rows if r[1] == phase and record["step"] - 4 <= int(r[0]) < record["step"]]
            assert record[f"Loss/{phase}"]["num"] == 4
            assert record[f"Loss/{phase}"]["mean"] == pytest.approx(sum(losses) / 4, rel=1e-5)  # the csv has 6 digits

    events = EventAccumulator(str(one), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("Loss/d")]
    assert got == [(s["step"], pytest.approx(s["Loss/d"]["mean"], rel=1e-6)) for s in stats]
    assert {"Progress/img_per_sec", "Timing/sec_per_step", "Skipped/g", "GradNorm/d", "GradNorm/g"} <= set(
        events.Tags()["scalars"])
    # Each optimizer group's learning rate (the spec's: mlp has no schedule), in both.
    optimizers = ganc.load_spec(archive("mlp"))["optimizers"]
    for group, settings in optimizers.items():
        assert all(s[f"LR/{group}"] == pytest.approx(settings.get("lr", 2e-4)) for s in stats), group
        assert [e.value for e in events.Scalars(f"LR/{group}")] == [pytest.approx(s[f"LR/{group}"]) for s in stats]
    assert all(s["GradNorm/d"]["num"] == 4 and s["GradNorm/d"]["mean"] > 0 for s in stats)
    assert [i.step for i in events.Images("samples")] == [6, 12]
    assert all(i.width > 0 and i.height > 0 for i in events.Images("samples"))

    two = tmp_path / "two"
    subprocess.run([ganc_bin, "run", "--nproc", "2", *train_args(plan, "mlp", datasets["ring"], str(two), 8,
                                                                 "--log-every", "4")], check=True, capture_output=True)
    record = json.loads((two / "stats.jsonl").read_text().splitlines()[-1])
    assert record["Loss/d"]["num"] == 2 * 4 and record["Loss/d"]["std"] > 0

    r = subprocess.run([sys.executable, "-m", "ganc.cli", "plot", str(one)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (one / "losses.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("case,says", [
    ("no-run", "holds no stats.jsonl or loss_history.csv: not a run directory"),
    ("not-a-directory", "is not a directory (give a run's directory, ganc train --out)"),
    ("bad-row", "loss_history.csv, line 3: not a step,phase,loss row"),
    ("bad-record", "stats.jsonl, line 2: not a stats record"),
    ("not-png", "-o {out}/losses: the plot is a PNG; give a path ending in .png"),
])
def test_plot_refuses_what_is_not_a_run_in_one_line(tmp_path, case, says):
    """`ganc plot` on a directory that is not a run, a damaged history, or an -o that would not
    be the PNG it names (matplotlib would add .png): one line naming the file and line, exit 2,
    nothing written."""
    out = tmp_path / "run"
    out.mkdir()
    args = [str(out)]
    if case == "not-a-directory":
        (tmp_path / "file").write_text("")
        args = [str(tmp_path / "file")]
    elif case == "bad-row":
        (out / "loss_history.csv").write_text("step,phase,loss\n1,d,0.5\n2,d,abc\n")
    elif case == "bad-record":
        (out / "stats.jsonl").write_text('{"step": 1, "Loss/d": {"mean": 1.0, "std": 0.0}}\n{"step": 2, "Loss/d": 3}\n')
    elif case == "not-png":
        (out / "loss_history.csv").write_text("step,phase,loss\n1,d,0.5\n")
        args += ["-o", str(out / "losses")]
    r = subprocess.run([sys.executable, "-m", "ganc.plot", *args], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert says.format(out=out) in r.stderr, r.stderr
    assert not list(tmp_path.rglob("*.png"))


def test_a_run_is_never_overwritten_by_accident(ganc_bin, datasets, tmp_path):
    """An --out that holds a run is refused (one line, exit 2, its files untouched); --resume
    auto continues from its latest checkpoint (or starts at 0 where there is none); --force
    starts over; step checkpoints beyond --keep-checkpoints are removed."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "run"
    first = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(out), 10,
                                                    "--checkpoint-every", "2", "--keep-checkpoints", "2",
                                                    "--resume", "auto"))
    assert first.returncode == 0 and "no checkpoint in" in first.stdout, first.stderr
    assert sorted(p.name for p in out.glob("checkpoint*.pt")) == ["checkpoint-0000008.pt", "checkpoint-0000010.pt",
                                                                   "checkpoint.pt"]
    assert (out / "checkpoint.pt").read_bytes() == (out / "checkpoint-0000010.pt").read_bytes()
    before = (out / "checkpoint.pt").read_bytes()

    again = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(out), 10))
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert "holds a run" in again.stderr and "--resume auto" in again.stderr
    assert (out / "checkpoint.pt").read_bytes() == before

    other_batch = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(out), 16, "--resume",
                                                          "auto", "--batch-size", "32"))
    assert other_batch.returncode == 2 and "would change the data stream" in other_batch.stderr
    resumed = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(out), 16, "--resume", "auto"))
    assert resumed.returncode == 0 and "at step 10" in resumed.stdout, resumed.stderr
    straight = tmp_path / "straight"
    subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(straight), 16)], check=True,
                   capture_output=True)
    a = ganc.load_checkpoint(str(out / "checkpoint.pt"))
    b = ganc.load_checkpoint(str(straight / "checkpoint.pt"))
    assert all(torch.equal(a["generator"][k], b["generator"][k]) for k in a["generator"])

    forced = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(out), 3, "--force"))
    assert forced.returncode == 0, forced.stderr
    assert ganc.load_checkpoint(str(out / "checkpoint.pt"))["step"] == 3
    assert not (out / "checkpoint-0000010.pt").exists()


def test_hyper_parameter_overrides_match_eager_ddp_with_that_spec(ganc_bin, datasets, tmp_path):
    """--lr, --betas, --interval and --batch-size change the run as the same values in the spec
    would: the
    parameters after training equal eager PyTorch DDP on an archive exported with them; the
    effective spec is recorded in run.json. Overrides naming no group or phase are refused."""
    import zoo
    from ganc import reference
    gan, spec = zoo.build("mlp")
    base, changed = str(tmp_path / "base.pt"), str(tmp_path / "changed.pt")
    ganc.export(gan, base, spec)
    spec2 = json.loads(json.dumps(spec))
    spec2["optimizers"]["generator"]["lr"] = 3e-3
    spec2["optimizers"]["discriminator"]["betas"] = [0.1, 0.9]
    next(p for p in spec2["phases"] if p["name"] == "g")["interval"] = 2
    spec2["batch_size"] = 32
    ganc.export(gan, changed, spec2)

    plan = str(tmp_path / "base.plan")
    subprocess.run([ganc_bin, "compile", base, "-o", plan], check=True, capture_output=True)
    got = str(tmp_path / "got")
    r = run_ganc(ganc_bin, "run", "--nproc", "2", plan, "--model", base, "--data", datasets["ring"], "--steps", "6",
                 "--out", str(tmp_path / "run"), "--sample-every", "0", "--dump-grads", got,
                 "--lr", "generator=3e-3", "--betas", "discriminator=0.1,0.9", "--interval", "g=2",
                 "--batch-size", "32")
    assert r.returncode == 0, r.stderr
    ref = str(tmp_path / "ref")
    reference.run(changed, datasets["ring"], 2, 6, 0, ref)
    mine = ganc.load_checkpoint(os.path.join(got, "params_final.pt"))
    theirs = torch.load(os.path.join(ref, "params_final.pt"))
    for k in theirs:
        assert torch.equal(mine[k], theirs[k]), k
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["spec"]["optimizers"]["generator"]["lr"] == 3e-3
    assert record["overrides"] == {"lr": {"generator": 3e-3}, "betas": {"discriminator": [0.1, 0.9]},
                                   "interval": {"g": 2}, "batch_size": 32}
    assert record["spec"]["batch_size"] == 32

    for bad, words in ((["--lr", "gen=1e-3"], "no optimizer group 'gen'"), (["--interval", "x=2"], "no phase 'x'"),
                       (["--betas", "1,0.5"], "--betas takes B1,B2 in [0, 1)"),
                       (["--batch-size", "0"], "--batch-size takes an integer from 1 to 16777216, not '0'"),
                       (["--log-every", "0"], "--log-every takes an integer from 1 to"),
                       (["--threads", "0"], "--threads takes an integer from 1 to 4096, not '0'"),
                       (["--samples", "200000"], "--samples takes an integer from 1 to 1024, not '200000'")):
        r = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "bad"), 2, *bad))
        assert r.returncode == 2 and words in r.stderr, r.stderr


def test_the_recipe_given_at_train_time_matches_eager_ddp_with_that_spec(ganc_bin, datasets, tmp_path):
    """An archive exported in float32 with no training-step features trains with
    ganc.train(precision="bfloat16", accumulate=..., clip=...) (set in the plan in memory at
    start-up, no new export or compile) exactly as eager DDP trains an archive whose spec holds
    those values; run.json records them, the run directory keeps the plan it trained (ganc
    explain reads it; it trains the same again). Bad values are refused in one line."""
    import zoo
    from ganc import reference
    gan, spec = zoo.build("mlp")
    base, changed = str(tmp_path / "base.pt"), str(tmp_path / "changed.pt")
    ganc.export(gan, base, spec)
    spec2 = json.loads(json.dumps(spec))
    spec2["ganc_spec"] = 2
    spec2["precision"] = "bfloat16"
    next(p for p in spec2["phases"] if p["name"] == "d")["accumulate"] = 2
    spec2["optimizers"]["generator"]["clip_grad_norm"] = {"max_norm": 0.05, "norm_type": 2.0}
    ganc.export(gan, changed, spec2)

    plan = ganc.compile(base, str(tmp_path / "base.plan"))
    got = str(tmp_path / "got")
    ganc.train(plan, data=datasets["ring"], nproc=2, steps=6, out=str(tmp_path / "run"), quiet=True,
               sample_every=0, dump_grads=got, precision="bfloat16", accumulate={"d": 2},
               clip={"generator": (0.05, 2)})
    ref = str(tmp_path / "ref")
    reference.run(changed, datasets["ring"], 2, 6, 0, ref)
    mine = ganc.load_checkpoint(os.path.join(got, "params_final.pt"))
    theirs = torch.load(os.path.join(ref, "params_final.pt"))
    for k in theirs:
        assert torch.equal(mine[k], theirs[k]), k
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["overrides"] == {"precision": {"*": "bfloat16"}, "accumulate": {"d": 2},
                                   "clip": {"generator": {"max_norm": 0.05, "norm_type": 2.0}}}
    phases = {p["name"]: p for p in record["spec"]["phases"]}
    assert phases["d"]["accumulate"] == 2 and phases["g"]["precision"] == "bfloat16"
    assert record["spec"]["optimizers"]["generator"]["clip_grad_norm"]["max_norm"] == 0.05

    # The run directory keeps the plan it trained: `ganc explain` reads it, and it trains as
    # that run did with no option given.
    explained = run_ganc(ganc_bin, "explain", str(tmp_path / "run"))
    assert explained.returncode == 0, explained.stderr
    assert "autocast: forward in bf16" in explained.stdout and "accumulate: 2 micro-batches" in explained.stdout
    assert "clip_grad_norm: generator to 0.05 (2.0-norm" in explained.stdout
    trained = json.loads(run_ganc(ganc_bin, "explain", str(tmp_path / "run"), "--json").stdout)
    assert {p["name"]: (p["autocast"], p["accumulate"]) for p in trained["phases"]} == {
        "d": ("bf16", 2), "g": ("bf16", 1)}
    again = str(tmp_path / "again")
    r = run_ganc(ganc_bin, "run", "--nproc", "2", str(tmp_path / "run" / "plan.ganc"), "--model", base, "--data",
                 datasets["ring"], "--steps", "6", "--out", str(tmp_path / "run2"), "--sample-every", "0",
                 "--dump-grads", again)
    assert r.returncode == 0, r.stderr
    rerun = ganc.load_checkpoint(os.path.join(again, "params_final.pt"))
    for k in theirs:
        assert torch.equal(rerun[k], theirs[k]), k
    r = run_ganc(ganc_bin, "explain", str(tmp_path))
    assert r.returncode == 2 and "without plan.ganc: not the --out of a ganc train run" in r.stderr, r.stderr

    for bad, words in ((["--precision", "fp8"], "--precision takes [PHASE=]one of float32, bfloat16, float16"),
                       (["--precision", "x=bfloat16"], "--precision x=: the spec has no phase 'x'"),
                       (["--accumulate", "d=1000000000"], "--accumulate takes PHASE=K with K from 1 to 4096"),
                       (["--clip", "gen=1.0"], "--clip gen=: the spec has no optimizer group 'gen'"),
                       (["--clip", "generator=1.0,0"], "--clip takes GROUP=MAX,TYPE with TYPE > 0 or \"inf\""),
                       (["--ema-half-life-images", "100"], "--ema-half-life-images: the spec has no 'ema'")):
        r = run_ganc(ganc_bin, "train", *train_args(plan.path, "mlp", datasets["ring"], str(tmp_path / "bad"), 2,
                                                    *bad))
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_kimg_gives_the_runs_length_in_images(ganc_bin, datasets, tmp_path):
    """--kimg K trains the steps that reach K thousand real images over every rank (the MLP GAN:
    batch 64 at 2 ranks, 128 images a step: 0.3 kimg is 3 steps); with --steps it is refused."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = str(tmp_path / "run")
    r = run_ganc(ganc_bin, "run", "--nproc", "2", plan, "--model", archive("mlp"), "--data", datasets["ring"],
                 "--kimg", "0.3", "--out", out, "--sample-every", "0", "--checkpoint-every", "1000")
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["options"]["steps"] == 3 and record["options"]["kimg"] == 0.3
    assert ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["images"] == 384
    r = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "bad"), 5, "--kimg", "1"))
    assert r.returncode == 2 and "--kimg and --steps both give the run's length: give one" in r.stderr, r.stderr


def test_kimg_after_a_resume_on_more_ranks_ends_at_the_images_asked_for(ganc_bin, datasets, tmp_path):
    """--kimg counts images, not steps: 0.128 kimg on 1 rank (64 images a step: 2 steps), then
    --kimg 0.512 resumed on 2 ranks (128 a step) trains 3 more steps to 512 images. The steps
    computed from step 0 at the new world size (4) once ended the run at 0.384 kimg, exit 0."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = str(tmp_path / "run")
    args = [plan, "--model", archive("mlp"), "--data", datasets["ring"], "--out", out, "--sample-every", "0",
            "--tensorboard", "off"]
    r = run_ganc(ganc_bin, "train", *args, "--kimg", "0.128")
    assert r.returncode == 0, r.stderr
    assert ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["images"] == 128
    r = run_ganc(ganc_bin, "run", "--nproc", "2", *args, "--kimg", "0.512", "--resume", "auto")
    assert r.returncode == 0, r.stderr
    state = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))
    assert (state["step"], state["images"]) == (5, 512), (state["step"], state["images"])
    r = run_ganc(ganc_bin, "train", *args, "--kimg", "0.256", "--resume", "auto")
    assert r.returncode == 2 and "has trained on 0.512 kimg, so --kimg 0.256 leaves nothing to train" in r.stderr, \
        r.stderr


def test_absurd_run_lengths_are_refused_in_one_line(ganc_bin, datasets, tmp_path):
    """A hexadecimal --kimg (strtod read 0x10 as 16: 250 steps) and --snap ticks past int64
    (their product once wrapped to checkpoint_every -140625000: no checkpoint, exit 0) are
    refused before any step."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    common = [plan, "--model", archive("mlp"), "--data", datasets["ring"]]
    for i, (bad, words) in enumerate((
            (["--kimg", "0x10"], "--kimg takes a number in [0.001, 1e+12), not '0x10'"),
            (["--tick-kimg", "0x1p3", "--kimg", "1"], "--tick-kimg takes a number in [0.001, 1e+12), not '0x1p3'"),
            (["--kimg", "1", "--tick-kimg", "1e9", "--snap", "9000000000000"],
             "--snap 9000000000000 ticks of --tick-kimg 1e+09 (15625000000 steps each) is past any run's length"))):
        out = str(tmp_path / f"bad{i}")
        r = run_ganc(ganc_bin, "train", *common, *bad, "--out", out)
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert not os.path.exists(os.path.join(out, "checkpoint.pt"))


def test_ticks_set_the_progress_and_snapshots_in_images(ganc_bin, datasets, tmp_path):
    """--tick-kimg K: a progress line every K thousand images, opening as train.py's tick line
    (tick, kimg, time, sec/tick, sec/kimg, cpumem) with its values in stats.jsonl under
    train.py's names; --snap N: the sample grid and a checkpoint every N ticks (StyleGAN's
    --tick and --snap; the MLP GAN at 2 ranks trains 128 images a step, so 0.256 kimg is 2
    steps); reals.png holds the data's first samples."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "run"
    r = run_ganc(ganc_bin, "run", "--nproc", "2", plan, "--model", archive("mlp"), "--data", datasets["ring"],
                 "--steps", "8", "--tick-kimg", "0.256", "--snap", "2", "--out", str(out), "--tensorboard", "off")
    assert r.returncode == 0, r.stderr
    options = json.loads((out / "run.json").read_text())["options"]
    assert (options["log_every"], options["sample_every"], options["checkpoint_every"]) == (2, 4, 4), options
    ticks = re.findall(r"^tick (\d+) +kimg (\S+) +time (?:\d+[dhms] ?)+ +sec/tick (\S+) +sec/kimg (\S+) +cpumem (\S+) "
                       r"+d \S+ +g \S+ ", r.stdout, re.M)
    assert [(int(t), k) for t, k, *_ in ticks] == [(1, "0.3"), (2, "0.5"), (3, "0.8"), (4, "1.0")], r.stdout
    assert all(float(cpumem) > 0 for *_, cpumem in ticks)
    stats = [json.loads(line) for line in (out / "stats.jsonl").read_text().splitlines()]
    stats = [s for s in stats if "Progress/tick" in s]
    assert [s["Progress/tick"] for s in stats] == [1, 2, 3, 4]
    for record in stats:
        assert record["Timing/sec_per_kimg"] == pytest.approx(record["Timing/sec_per_tick"] / 0.256)
        assert record["Timing/total_sec"] > 0 and record["Resources/cpu_mem_gb"] > 0
    assert sorted(p.name for p in out.glob("checkpoint-*.pt")) == ["checkpoint-0000004.pt", "checkpoint-0000008.pt"]
    assert sorted(p.name for p in out.glob("samples_step*.png")) == ["samples_step4.png", "samples_step8.png"]
    assert (out / "reals.png").stat().st_size > 0
    r = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "bad"), 5, "--snap", "2"))
    assert r.returncode == 2 and "--snap counts ticks: give --tick-kimg too" in r.stderr, r.stderr
    # An interval given in steps is never replaced without a word (--tick-kimg once overrode
    # --log-every, and --snap --sample-every and --checkpoint-every, silently).
    for flag, words in (("--log-every", "--tick-kimg and --log-every both give the progress interval: give one"),
                        ("--sample-every", "--snap and --sample-every both give the sample and checkpoint intervals"),
                        ("--checkpoint-every", "--snap and --checkpoint-every both give")):
        r = run_ganc(ganc_bin, "train", plan, "--model", archive("mlp"), "--data", datasets["ring"], "--steps", "4",
                     "--tick-kimg", "0.256", "--snap", "2", flag, "3", "--out", str(tmp_path / "both"))
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, (flag, r.stderr)
        assert not (tmp_path / "both" / "run.json").exists()


def test_a_spec_with_zero_2_compiles(ganc_bin, tmp_path):
    """"zero": 2 is a documented value (docs/spec.md); the C++ reader once wanted a string."""
    import zoo
    gan, spec = zoo.build("mlp")
    path = str(tmp_path / "z.pt")
    ganc.export(gan, path, dict(spec, ganc_spec=2, zero=2))
    r = subprocess.run([ganc_bin, "compile", path, "-o", str(tmp_path / "z.plan")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_torchrun_uses_its_agent_store_and_slurm_names_the_master(ganc_bin, datasets, tmp_path):
    """Under torchrun the ranks join its agent's store (no second server binding the port,
    no error line); under SLURM without MASTER_ADDR the first host of the node list serves
    the store, and a node list ganc cannot read is refused in one line."""
    from ganc.reference import free_port
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE"))}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", str(free_port()), "--no-python", ganc_bin, "train",
                        *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "tr"), 6, "--resume", "auto")],
                       capture_output=True, text=True, env=dict(env, OMP_NUM_THREADS="1"), timeout=300)
    assert r.returncode == 0, r.stderr
    noise = [line for line in r.stderr.splitlines() if any(w in line.lower() for w in ("error", "bind", "fail"))]
    assert noise == [], noise
    assert ganc.load_checkpoint(str(tmp_path / "tr" / "checkpoint.pt"))["step"] == 6

    slurm = dict(env, SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0", SLURM_JOB_NODELIST="localhost",
                 MASTER_PORT=str(free_port()))
    r = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "sl"), 2), env=slurm)
    assert r.returncode == 0, r.stderr
    r = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "sl2"), 2),
                 env=dict(slurm, SLURM_JOB_NODELIST="gpu[,x"))
    assert r.returncode == 2 and "SLURM_JOB_NODELIST='gpu[,x'" in r.stderr and "MASTER_ADDR" in r.stderr, r.stderr


def test_a_failed_export_leaves_the_process_able_to_export(tmp_path):
    """A module class TorchScript cannot compile, whose trace would freeze a Python random
    draw, fails the export with its error, again with the same error on a second try, and a
    corrected class then exports (scripted: TorchScript's failed types are not kept)."""
    import copy
    import random
    import zoo
    gan, spec = zoo.build("mlp")

    def wrap(forward):
        cls = type("Wrapped", (torch.nn.Module,), {"forward": forward})
        m = copy.deepcopy(gan)
        inner = m.discriminator
        m.discriminator = cls()
        m.discriminator.inner = inner
        return m

    def bad(self, x):
        return self.inner(x) * len({k: 1 for k in range(2)}.items().__iter__.__name__) * random.random()

    broken = wrap(bad)
    for _ in range(2):
        with pytest.raises(ganc.ExportError, match=r"discriminator \(.*\): random.random\(\) .* does not "
                                                   r"script \(.*__iter__"):
            ganc.export(broken, str(tmp_path / "bad.pt"), spec)

    def good(self, x):
        return self.inner(x)

    ganc.export(wrap(good), str(tmp_path / "good.pt"), spec)
    assert ganc.load_spec(str(tmp_path / "good.pt"))["name"] == spec["name"]


def _image_set(root, names_and_values):
    """PNG files of 32x32 pixels, each one colour (`value`), at the given relative paths."""
    from PIL import Image
    for name, value in names_and_values:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32, 32), (value, value, value)).save(path)


def _batch(dump, step=0):
    """The real images and labels phase d trained on at `step`."""
    inputs = ganc.load_checkpoint(os.path.join(dump, f"inputs_step{step}_d.pt"))
    return inputs["real"], inputs["labels"]


@pytest.mark.parametrize("layout", ["folders", "zip", "dataset_json"])
def test_image_sets_in_class_folders_zips_and_dataset_json(ganc_bin, tmp_path, layout):
    """Images in one folder per class (nested below it) are labelled by the folder's index in
    sorted order, as torchvision's ImageFolder does; the same set as a zip archive (deflated)
    reads the same; StyleGAN's dataset.json labels override the folders. Each class's images
    are one colour, so every trained sample shows which label it was given."""
    import zipfile
    files = [(f"cat/{i:02d}.png", 0) for i in range(20)] + [(f"dog/deep/{i:02d}.png", 255) for i in range(20)]
    root = tmp_path / "set"
    _image_set(root, files)
    expected = {0: -1.0, 1: 1.0}  # cat (black) is class 0, dog (white) class 1
    data = str(root)
    if layout == "dataset_json":
        # Labels from dataset.json, swapped against the folder order.
        (root / "dataset.json").write_text(json.dumps({"labels": [[n, 1 if v == 0 else 0] for n, v in files]}))
        expected = {1: -1.0, 0: 1.0}
    if layout == "zip":
        data = str(tmp_path / "set.zip")
        with zipfile.ZipFile(data, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for name, _ in files:
                z.write(root / name, name)
    plan = compile_plan(ganc_bin, "cdcgan32", str(tmp_path))
    dump = str(tmp_path / "dump")
    r = run_ganc(ganc_bin, "train", plan, "--model", archive("cdcgan32"), "--data", data, "--steps", "2",
                 "--out", str(tmp_path / "run"), "--sample-every", "0", "--dump-grads", dump)
    assert r.returncode == 0, r.stderr
    assert ("dataset.json" if layout == "dataset_json" else "2 classes from folder names") in r.stdout
    for step in (0, 1):
        real, labels = _batch(dump, step)
        assert real.shape == (32, 3, 32, 32) and set(labels.tolist()) <= {0, 1}
        for image, label in zip(real, labels.tolist()):
            assert torch.all(image == expected[label]), (label, image.mean())


@pytest.mark.parametrize("labels,says", [
    (None, "has none"),  # dataset_tool's unlabelled output: not 3 classes from its folders
    ("twice", "dataset.json labels 00000/img00000000.png twice"),
], ids=["null", "duplicate"])
def test_dataset_tool_zips_are_labelled_by_their_dataset_json(ganc_bin, tmp_path, labels, says):
    """A zip laid out as StyleGAN's dataset_tool writes it (images in 00000/, 00001/, ...
    folders of 1000) with `"labels": null` is unlabelled, as StyleGAN reads it, not one class
    per folder: a conditional model is refused for want of labels. A path labelled twice is
    refused naming it. Both before anything trains."""
    import zipfile
    files = [(f"{i // 4:05d}/img{i:08d}.png", 0) for i in range(12)]
    root = tmp_path / "set"
    _image_set(root, files)
    listed = None if labels is None else [[n, 0] for n, _ in files] + [[files[0][0], 1]]
    data = str(tmp_path / "set.zip")
    with zipfile.ZipFile(data, "w") as z:
        for name, _ in files:
            z.write(root / name, name)
        z.writestr("dataset.json", json.dumps({"labels": listed}))
    plan = compile_plan(ganc_bin, "cdcgan32", str(tmp_path))
    r = run_ganc(ganc_bin, "train", plan, "--model", archive("cdcgan32"), "--data", data, "--steps", "1",
                 "--out", str(tmp_path / "run"), "--sample-every", "0")
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert "classes from folder names" not in r.stdout


def test_xflip_doubles_the_set_like_the_eager_reference(ganc_bin, datasets, tmp_path):
    """data.xflip: the set doubled with mirrored images, in ganc and in the eager DDP
    reference the same way: gradients and parameters after 3 steps at 2 ranks are equal."""
    import zoo
    from ganc import reference
    gan, spec = zoo.build("dcgan32")
    spec["data"]["xflip"] = True
    model = str(tmp_path / "flip.pt")
    ganc.export(gan, model, spec)
    plan = str(tmp_path / "flip.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    got, ref = str(tmp_path / "got"), str(tmp_path / "ref")
    r = run_ganc(ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", datasets["digits"], "--steps", "3",
                 "--out", str(tmp_path / "run"), "--sample-every", "0", "--dump-grads", got)
    assert r.returncode == 0, r.stderr
    reference.run(model, datasets["digits"], 2, 3, 0, ref)
    mine = ganc.load_checkpoint(os.path.join(got, "params_final.pt"))
    theirs = torch.load(os.path.join(ref, "params_final.pt"))
    assert set(mine) == set(theirs)
    for k in theirs:
        assert torch.allclose(mine[k], theirs[k], rtol=1e-4, atol=1e-6), k
    # The same run without the mirrored half trains on other batches.
    plain = str(tmp_path / "plain.pt")
    spec["data"]["xflip"] = False
    ganc.export(gan, plain, spec)
    ref2 = str(tmp_path / "ref2")
    reference.run(plain, datasets["digits"], 2, 3, 0, ref2)
    other = torch.load(os.path.join(ref2, "params_final.pt"))
    assert any(not torch.equal(other[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize("scale,said", [
    (lambda x: (x - x.min()) / (x.max() - x.min()), ["like images in [0, 1]", "x * 2 - 1"]),
    (lambda x: (x - x.min()) / (x.max() - x.min()) * 255, ["like 8-bit pixels", "x / 127.5 - 1"]),
    # Once called "8-bit pixels" too.
    (lambda x: x * 1e30, ["far outside [-1, 1]", "rescale them"])], ids=["zero_one", "pixels", "huge"])
def test_data_outside_the_unit_range_gets_a_warning(ganc_bin, datasets, tmp_path, scale, said):
    """Data that looks like images in [0, 1] or [0, 255], or that is far outside [-1, 1],
    trains, with one warning saying what it looks like and how to scale it."""
    data = torch.load(datasets["ring"])
    data = data["images"] if isinstance(data, dict) else data
    scaled = str(tmp_path / "scaled.pt")
    torch.save(scale(data.double()).float(), scaled)
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    r = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", scaled, str(tmp_path / "run"), 2))
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and scaled in warnings[0] and all(w in warnings[0] for w in said), r.stderr


def test_a_single_number_as_data_is_refused_naming_the_file(ganc_bin, tmp_path):
    """A 0-d tensor file (a raw "dimension specified as 0" error naming no file once)."""
    path = str(tmp_path / "one.pt")
    torch.save(torch.tensor(1.0), path)
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    r = run_ganc(ganc_bin, "train", *train_args(plan, "mlp", path, str(tmp_path / "run"), 2))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--data {path}: holds a single number (a 0-d tensor), not samples [N, " in r.stderr, r.stderr


@pytest.mark.parametrize("trace", [False, True], ids=["scripted", "traced"])
def test_phases_log_values_besides_their_loss(ganc_bin, datasets, tmp_path, trace):
    """A phase method returning (loss, {name: scalar}) trains exactly as the loss alone does in
    eager DDP; its values reach stats.jsonl averaged over ranks and the interval (the logged
    copy of the loss equals Loss/d), TensorBoard and the plot."""
    import zoo
    from ganc import reference
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    gan, spec = zoo.build("mlp_stats")
    model = str(tmp_path / "stats.pt")
    ganc.export(gan, model, spec, trace=trace)
    plan = str(tmp_path / "stats.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    out, got, ref = tmp_path / "run", str(tmp_path / "got"), str(tmp_path / "ref")
    r = run_ganc(ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", datasets["ring"], "--steps", "10",
                 "--out", str(out), "--sample-every", "0", "--log-every", "5", "--dump-grads", got)
    assert r.returncode == 0, r.stderr
    reference.run(model, datasets["ring"], 2, 10, 0, ref)
    mine = ganc.load_checkpoint(os.path.join(got, "params_final.pt"))
    theirs = torch.load(os.path.join(ref, "params_final.pt"))
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    for record in [json.loads(line) for line in (out / "stats.jsonl").read_text().splitlines()]:
        assert record["Stats/d/loss"]["num"] == record["Loss/d"]["num"] == 2 * 5
        assert record["Stats/d/loss"]["mean"] == pytest.approx(record["Loss/d"]["mean"], rel=1e-6)
        assert record["Stats/d/loss"]["std"] == pytest.approx(record["Loss/d"]["std"], rel=1e-4, abs=1e-7)
        assert {"Stats/d/D_real", "Stats/d/D_fake"} <= set(record) and not any(k.startswith("Stats/g") for k in record)
    events = EventAccumulator(str(out))
    events.Reload()
    assert [e.step for e in events.Scalars("Stats/d/D_real")] == [5, 10]
    r = subprocess.run([sys.executable, "-m", "ganc.plot", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and (out / "losses.png").exists(), r.stderr


def test_a_phase_returning_a_malformed_tuple_is_refused(tmp_path):
    import zoo
    gan, spec = zoo.build("mlp")

    class Bad(type(gan)):
        def phase_d(self, real, z):
            return super().phase_d(real, z), real.mean()

    bad = Bad()
    bad.load_state_dict(gan.state_dict())
    with pytest.raises(ganc.SpecError, match=r"must be \(loss, \{name: scalar tensor"):
        ganc.export(bad, str(tmp_path / "bad.pt"), spec)


GPU_CHECK = os.path.join(ROOT, "scripts", "gpu_check.sh")


def gpu_check(*args, env=None, **popen):
    environment = dict(os.environ, GANC_PYTHON=sys.executable, **(env or {}))
    return subprocess.Popen(["bash", GPU_CHECK, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=environment, start_new_session=True, **popen)


def test_gpu_check_uses_a_prebuilt_binary_of_these_sources_only(ganc_bin, tmp_path):
    """scripts/gpu_check.sh --prebuilt (the GPU machine's time goes to tests, not the build):
    a binary saved with this tree's source hash and this torch runs instead of a build; one
    saved from other sources is refused in one line, and the script builds instead."""
    check = subprocess.run(["bash", GPU_CHECK, "--source-hash"], capture_output=True, text=True)
    source_hash = check.stdout.strip()
    assert check.returncode == 0 and len(source_hash) == 16, check
    assert subprocess.run(["bash", GPU_CHECK, "--source-hash"], capture_output=True, text=True).stdout.strip() \
        == source_hash
    prebuilt = tmp_path / "prebuilt"
    (prebuilt / "tools").mkdir(parents=True)
    (prebuilt / "ops").mkdir()
    shutil.copy(ganc_bin, prebuilt / "tools" / "ganc")
    # ganc's ops library goes with the binary (--save-build saves both).
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(ganc_bin)), "ops", "libganc_ops.so"), prebuilt / "ops")
    (prebuilt / "SOURCE_HASH").write_text(source_hash + "\n")
    (prebuilt / "TORCH").write_text(torch.__version__ + "\n")
    version = subprocess.run([ganc_bin, "--version"], capture_output=True, text=True).stdout.strip()
    build = tmp_path / "build-gpu"
    zoo = os.path.dirname(archive("dcgan32"))  # exported already: --zoo skips the minute of export
    p = gpu_check(str(tmp_path / "out"), "--prebuilt", str(prebuilt), "--skip-tests", "--skip-bench",
                  "--skip-scaling", "--zoo", zoo, env={"GANC_GPU_BUILD": str(build)})
    if "CUDA backend off" in version:  # a torch without CUDA: nothing to run on a GPU
        for line in p.stdout:
            if "not used" in line:
                break
        os.killpg(p.pid, 9)
        p.wait()
        assert "(it was built without the CUDA backend): building" in line, line
        return
    out, _ = p.communicate(timeout=300)
    assert f"prebuilt: {version} (sources {source_hash}), no build" in out, out
    assert (build / "tools" / "ganc").exists(), out
    assert f"using the zoo exported in {os.path.realpath(zoo)}" in out and "exported the zoo" not in out, out
    assert "configuring" not in out, out
    if torch.cuda.is_available():
        assert p.returncode == 0, out  # then the smoke run trained 4 captured steps
    else:
        assert p.returncode == 3, out
        assert out.splitlines()[-1].endswith("STOPPED: no CUDA GPU visible (torch.cuda.is_available() is False): "
                                             "built (or prebuilt) and exported, nothing run"), out
    # Built from other sources: refused, and the script goes on to build (stopped here).
    (prebuilt / "SOURCE_HASH").write_text("0" * 16 + "\n")
    p = gpu_check(str(tmp_path / "out2"), "--prebuilt", str(prebuilt), "--skip-tests", "--skip-bench",
                  "--skip-scaling", env={"GANC_GPU_BUILD": str(tmp_path / "build-stale")})
    seen = []
    for line in p.stdout:
        seen.append(line)
        if "not used" in line or "configuring" in line:
            break
    os.killpg(p.pid, 9)
    p.wait()
    assert f"prebuilt {prebuilt} not used (it was built from other sources): building" in seen[-1], seen


@pytest.mark.parametrize("args,says", [
    (["--deadline", "9m"], "STOPPED: --deadline takes whole seconds, not '9m'"),
    (["--test-seconds", "1.5"], "STOPPED: --test-seconds takes whole seconds, not '1.5'"),
    (["--zoo", "/nonexistent/zoo"], "STOPPED: --zoo: /nonexistent/zoo holds no exported zoo (no dcgan32.pt)"),
    (["--stages", "tests,bench,lunch"], "STOPPED: --stages: unknown stage 'lunch' (tests, official, probe, bench, scaling)"),
    (["--stages", "official"], "STOPPED: --stages names official without --official REPO"),
    (["--stages", "probe"], "STOPPED: --stages names probe without --official REPO"),
    (["--official", "/nonexistent/stylegan3"], "STOPPED: --official: no folder /nonexistent/stylegan3"),
    (["--frobnicate"], "gpu_check: unknown option --frobnicate"),
])
def test_gpu_check_refuses_bad_options_in_one_line(tmp_path, args, says):
    p = gpu_check(str(tmp_path / "out"), *args)
    lines = p.communicate(timeout=60)[0].strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].endswith(says), lines


def test_train_keywords_follow_the_option_table(ganc_bin, datasets, tmp_path):
    """ganc.train's keywords map to `ganc train`'s options by their declared values
    (python/ganc/train_options.json, generated from the option table): tensorboard=False is
    --tensorboard off and writes no events, tensorboard=True is --tensorboard on (it once
    swallowed the next option); an unknown keyword, a bool where a number goes, and a 0-d or
    complex tensor as data are refused in one line before anything runs."""
    plan = ganc.compile(archive("mlp"), str(tmp_path / "mlp.plan"))
    off = tmp_path / "off"
    ganc.train(plan, data=datasets["ring"], steps=2, out=str(off), quiet=True, tensorboard=False)
    assert not any(n.startswith("events.out.tfevents.") for n in os.listdir(off))
    on = tmp_path / "on"
    summary = ganc.train(plan, data=datasets["ring"], out=str(on), quiet=True, tensorboard=True, steps=2)
    assert summary["steps"] == 2
    for keywords, message in (({"frobnicate": 1}, "unknown option frobnicate="),
                              ({"steps": True}, "steps= takes N, not True")):
        with pytest.raises(TypeError, match=message):
            ganc.train(plan, data=datasets["ring"], out=str(tmp_path / "never"), quiet=True, **keywords)
    for data, message in ((torch.tensor(1.0), "not a 0-d tensor"),
                          (torch.zeros(8, 2, dtype=torch.complex64), "not a complex tensor")):
        with pytest.raises(TypeError, match=message):
            ganc.train(plan, data=data, steps=2, out=str(tmp_path / "never"), quiet=True)
    assert not (tmp_path / "never").exists()


def test_resample_probe_formulations_agree():
    """bench/resample_probe.py times StyleGAN2's upfirdn2d calls in other formulations on a GPU
    (strided and transposed convolutions, separable passes, NCHW, channels folded into the
    batch); each must compute ref's resampling. In float64, over upsampling, downsampling and
    plain filters with crops, gains, flips and unequal factors, they agree to rounding, and a
    formulation with its filter upside down is caught."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import resample_probe as probe
    assert probe.float64_check() < 1e-12
    right = probe.CANDIDATES["strided"]
    probe.CANDIDATES["strided"] = lambda x, f, **kw: right(x, f.flip([0]), **kw)
    try:
        assert probe.float64_check() > 0.01
    finally:
        probe.CANDIDATES["strided"] = right


def test_double_backward_probe_formulations_agree():
    """bench/double_backward_probe.py times a convolution's double backward two ways on a GPU;
    both must be the same gradient. In float64, through strided, depthwise, 1x1 and transposed
    convolutions (R1 plus a penalty on one weight's gradient), they agree to rounding, and a
    wrong term in the weight gradient's own backward shows."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import double_backward_probe as probe
    assert probe.float64_check() < 1e-12
    right = probe._GradWeight.backward

    def doubled(ctx, ggw):
        g_gy, g_x, *rest = right(ctx, ggw)
        return (2 * g_gy, g_x, *rest)

    probe._GradWeight.backward = staticmethod(doubled)
    try:
        assert probe.float64_check() > 0.1
    finally:
        probe._GradWeight.backward = staticmethod(right)


@pytest.mark.parametrize("kind,says", [
    ("float", "'labels' are float, and sample 5's is 1.500000: class labels are integers (save them as int64)"),
    ("nan", "'labels' are float, and sample 5's is nan: class labels are integers (save them as int64)"),
    ("strings", "'labels' is a list holding String values: class labels are integers"),
    ("list", None),
], ids=["float", "nan", "strings", "list"])
def test_labels_are_class_ids_as_dataset_json_has_them(ganc_bin, datasets, tmp_path, kind, says):
    """A tensor file's labels are integer class ids, as dataset.json's must be: float labels
    (1.5 was truncated to class 1, NaN to an arbitrary class) and lists of anything but ints
    are refused in one line before any step; a list of ints is read as an int64 tensor."""
    data = torch.load(datasets["digits"])
    labels = data["labels"].clone()
    if kind in ("float", "nan"):
        labels = labels.float()
        labels[5] = 1.5 if kind == "float" else float("nan")
    elif kind == "strings":
        labels = [str(int(v)) for v in labels]
    else:
        labels = [int(v) for v in labels]
    path = str(tmp_path / "labelled.pt")
    torch.save({"images": data["images"], "labels": labels}, path)
    plan = compile_plan(ganc_bin, "cdcgan32", str(tmp_path))
    r = run_ganc(ganc_bin, "train", plan, "--model", archive("cdcgan32"), "--data", path, "--steps", "1",
                 "--out", str(tmp_path / "run"), "--sample-every", "0")
    if says is None:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
        assert not (tmp_path / "run" / "checkpoint.pt").exists()
