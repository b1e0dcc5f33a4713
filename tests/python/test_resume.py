"""Stopped and resumed runs: nothing a stopped run had is lost (its logs included), and a
resume continues the run it names, with the settings that run had, or says what differs.
"""
import json
import os
import signal
import subprocess

import pytest

from conftest import compile_plan, started_ranks, train_args


def _logged(out):
    """loss_history.csv's (step, phase) rows and stats.jsonl's records of the run in `out`."""
    rows = [tuple(line.split(",")[:2]) for line in (out / "loss_history.csv").read_text().splitlines()[1:]]
    records = [json.loads(line) for line in (out / "stats.jsonl").read_text().splitlines()]
    return rows, [r for r in records if "Loss/d" in r]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_logs_survive_a_stop_and_resume(ganc_bin, datasets, tmp_path, sig):
    """A run stopped between log steps (SIGTERM: checkpointed where it stopped; kill -9: resumed
    from the last periodic checkpoint, written between log steps) and resumed with --resume auto
    logs every step exactly once in loss_history.csv, and each stats.jsonl record counts its
    interval's steps on both ranks: the rows and the interval a checkpoint cuts are kept in it."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    steps, log_every = 60, 10
    args = train_args(plan, "mlp", datasets["ring"], str(out), steps, "--log-every", str(log_every),
                      "--checkpoint-every", "7", "--tensorboard", "off")
    args[args.index("--steps") + 1] = str(10**7)  # stopped long before its end
    proc = subprocess.Popen([ganc_bin, "run", "--nproc", "2", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in proc.stdout:
        if line.startswith(f"step {log_every}/"):
            break
    os.killpg(proc.pid, sig)
    proc.communicate(timeout=90)
    import ganc
    reached = ganc.load_checkpoint(str(out / "checkpoint.pt"))["step"]
    assert reached >= 7, reached  # between log steps but on a loaded machine (SIGTERM)
    args[args.index("--steps") + 1] = str(reached + 2 * log_every - reached % log_every)
    resumed = subprocess.run([ganc_bin, "run", "--nproc", "2", *args, "--resume", "auto"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    end = int(args[args.index("--steps") + 1])
    rows, records = _logged(out)
    assert sorted(rows) == sorted((str(s), p) for s in range(end) for p in ("d", "g")), \
        f"stopped at {reached}: rows lost or repeated"
    assert [r["step"] for r in records] == list(range(log_every, end + 1, log_every))
    for r in records:
        assert r["Loss/d"]["num"] == 2 * log_every and r["GradNorm/d"]["num"] == 2 * log_every, \
            (reached, r["step"], r["Loss/d"], r["GradNorm/d"])


def _other_data(path, tmp_path):
    """The data set at `path` with one sample changed: another data set of the same shape."""
    import torch
    data = torch.load(path)
    data = (data["images"] if isinstance(data, dict) else data).clone()
    data[3] += 0.25
    other = str(tmp_path / "other.pt")
    torch.save(data, other)
    return other


def test_a_resume_that_changes_what_the_run_trains_is_refused_or_recorded(ganc_bin, datasets, tmp_path):
    """A resume with another learning rate, accumulation, clipping or data set than the run's is
    refused in one line naming each change (the run's files untouched); --accept-changes goes
    on with them and run.json records them as a new segment, its first segment's settings kept.
    A resume with the run's settings needs nothing."""
    import ganc
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    args = lambda steps, data, *extra: [ganc_bin, "train", *train_args(plan, "mlp", data, str(out), steps,
                                                                          "--checkpoint-every", "4", *extra)]
    subprocess.run(args(4, datasets["ring"]), check=True, capture_output=True)
    before = (out / "checkpoint.pt").read_bytes()
    other = _other_data(datasets["ring"], tmp_path)
    changed = ["--lr", "discriminator=0.0005", "--accumulate", "d=2", "--clip", "generator=1"]
    r = subprocess.run(args(8, other, "--resume", "auto", *changed), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for said in ("this resume changes what the run trains", "--lr discriminator 0.0005 (the run's: 0.001)",
                 "--accumulate d 2 (the run's: 1)", "--clip generator 1,2 (the run's: off)", "--data digest",
                 "--accept-changes"):
        assert said in r.stderr, (said, r.stderr)
    assert (out / "checkpoint.pt").read_bytes() == before
    assert json.load(open(out / "run.json"))["segments"][0]["first_step"] == 0

    r = subprocess.run(args(8, other, "--resume", "auto", "--accept-changes", *changed), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "at step 4" in r.stdout, r.stderr
    record = json.load(open(out / "run.json"))
    assert [s["first_step"] for s in record["segments"]] == [0, 4]
    changes = record["segments"][1]["changes"]
    assert changes["--lr discriminator"] == "0.0005 (was 0.001)" and changes["--accumulate d"] == "2 (was 1)"
    assert sorted(changes) == ["--accumulate d", "--clip generator", "--data", "--lr discriminator"], changes
    assert record["spec"]["optimizers"]["discriminator"]["lr"] == 0.001  # the first segment's
    assert record["segments"][1]["overrides"]["accumulate"] == {"d": 2}
    assert ganc.load_checkpoint(str(out / "checkpoint.pt"))["step"] == 8

    # The checkpoint now holds the accepted settings: resuming with them needs nothing.
    r = subprocess.run(args(12, other, "--resume", "auto", *changed), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "changes" not in json.load(open(out / "run.json"))["segments"][2]


def test_a_changed_ema_half_life_names_the_betas_a_step_takes(ganc_bin, datasets, tmp_path):
    """The EMA setting a resume compares is the half-life with the beta it gives a step
    (0.5 ** (images per step / half-life)); it once printed the spec's unused beta."""
    import ganc
    plan = compile_plan(ganc_bin, "mlp_ema", str(tmp_path))
    out = tmp_path / "o"
    args = lambda steps, half_life, *extra: [
        ganc_bin, "train", *train_args(plan, "mlp_ema", datasets["ring"], str(out), steps,
                                       "--ema-half-life-images", half_life, *extra)]
    subprocess.run(args(2, "100"), check=True, capture_output=True)
    state = ganc.load_checkpoint(str(out / "checkpoint.pt"))
    per_step = state["images"] / state["step"]
    beta = lambda half_life: f"{0.5 ** (per_step / half_life):.9g}"
    r = subprocess.run(args(4, "200", "--resume", "auto"), capture_output=True, text=True, timeout=120)
    said = f"--ema-half-life-images 200 (beta {beta(200)}) (the run's: 100 (beta {beta(100)}))"
    assert r.returncode == 2 and said in r.stderr, (said, r.stderr)


def test_force_never_resumes_the_run_it_replaced(ganc_bin, datasets, tmp_path):
    """--force over a run keeps the replaced run's checkpoint as checkpoint-replaced.pt (nothing
    lost) until the new run writes its own; a forced run that failed before that is never
    continued from the replaced run's checkpoint by --resume auto."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    args = lambda steps, *extra: [ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(out), steps,
                                                                  "--checkpoint-every", "4", *extra)]
    subprocess.run(args(4), check=True, capture_output=True)
    replaced = (out / "checkpoint.pt").read_bytes()
    failed = subprocess.run([*args(8, "--force"), "--data", str(tmp_path / "missing.pt")],
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2 and "missing.pt" in failed.stderr, failed.stderr
    assert not (out / "checkpoint.pt").exists() and (out / "checkpoint-replaced.pt").read_bytes() == replaced
    r = subprocess.run(args(6, "--resume", "auto"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "no checkpoint in" in r.stdout and "starting at step 0" in r.stdout, r.stdout
    assert not (out / "checkpoint-replaced.pt").exists()  # the new run wrote its own


def test_ranks_on_different_data_stop_at_start(ganc_bin, datasets, tmp_path):
    """Two ranks given different data sets (node-local copies that differ) stop before any step,
    every rank, in one line, where they would have trained on different data."""
    from ganc.reference import free_port
    import sys
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    other = _other_data(datasets["ring"], tmp_path)
    common = train_args(plan, "mlp", "DATA", str(tmp_path / "o"), 4)
    script = "exec \"$0\" train \"$@\" --data $([ \"$RANK\" = 0 ] && echo {} || echo {})".format(
        datasets["ring"], other)
    common.remove("--data")
    common.remove("DATA")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE"))}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", str(free_port()), "--no-python", "sh", "-c", script, ganc_bin, *common],
                       capture_output=True, text=True, env=dict(env, OMP_NUM_THREADS="1"), timeout=300)
    assert r.returncode != 0, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("ganc: error")]
    assert said and all("the ranks loaded different data sets (rank 0 data digest" in line for line in said), \
        r.stderr
    assert not (tmp_path / "o" / "checkpoint.pt").exists()


def test_a_stop_as_the_run_ends_leaves_it_complete(ganc_bin, datasets, tmp_path):
    """SIGTERM to the whole run just after its last step (the ranks write their last
    checkpoint, summary.json and tear down): every rank finished its steps, so `ganc run`
    exits 0 and says the run is complete (it exited 143, as if the run had been cut short)."""
    import ganc
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    proc = subprocess.Popen([ganc_bin, "run", "--nproc", "2",
                             *train_args(plan, "mlp", datasets["ring"], str(out), 30, "--log-every", "30",
                                         "--tensorboard", "off")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in proc.stdout:
        if line.startswith("step 30/30"):
            break
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # already gone: nothing to stop
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert ganc.load_checkpoint(str(out / "checkpoint.pt"))["step"] == 30
    assert (out / "summary.json").exists() and "stopped after step" not in err, err
