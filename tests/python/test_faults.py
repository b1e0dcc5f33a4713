"""Fault injection: each fault a long multi-rank run meets, and what ganc does about it.

Rendezvous that never answers, a rank or the launcher killed, signals, bad and damaged files
(truncated or flipped checkpoints, data and archives; an edited plan), a full disk, non-finite
values under both policies, resumes that would not continue the run. Every fault ends in one
line naming what is wrong and a non-zero exit, never a hang, an orphaned rank, a crash or a
lost file.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

import ganc
from conftest import archive, compile_plan, started_ranks, train_args


def test_resume_refuses_what_would_not_continue_the_run(ganc_bin, datasets, tmp_path):
    """A resume that would train nothing, or on other noise and data streams, is bad input."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    first = str(tmp_path / "first")
    subprocess.run([ganc_bin, "run", "--nproc", "1", *train_args(plan, "mlp", datasets["ring"], first, 3,
                    "--checkpoint-every", "3")], check=True)
    checkpoint = os.path.join(first, "checkpoint.pt")
    base = [plan, "--model", archive("mlp"), "--data", datasets["ring"], "--out", str(tmp_path / "again"),
            "--sample-every", "0", "--resume", checkpoint]
    cases = [(["--steps", "3"], "the checkpoint is at step 3, so --steps 3 leaves nothing to train"),
             (["--steps", "6", "--seed", "5"], "written with --seed 0, resuming with --seed 5")]
    for extra, message in cases:
        result = subprocess.run([ganc_bin, "run", "--nproc", "1", *base, *extra], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr, result.stderr


@pytest.mark.parametrize("peer", ["silent listener", "nobody", "store without peers"])
def test_rendezvous_gives_up_with_one_line(ganc_bin, datasets, tmp_path, peer):
    """Rank 1 waiting for a rendezvous store that never answers (a port held by a listener
    that accepts and says nothing), that is not there, or that answers while rank 0 never
    joins the process group, gives up after --timeout-s with one line and exit 2: no hang,
    no c10d stack traces."""
    import socket
    from datetime import timedelta
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    store = None
    if peer == "silent listener":
        listener.listen(8)
    else:
        listener.close()
    if peer == "store without peers":
        store = torch.distributed.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=60),
                                           wait_for_workers=False)
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    env.pop("TORCH_CPP_LOG_LEVEL", None)
    start = time.time()
    result = subprocess.run([ganc_bin, "train", *train_args(plan, "dcgan32", datasets["digits"],
                                                            str(tmp_path / "out"), 2, "--timeout-s", "3")],
                            env=env, capture_output=True, text=True, timeout=60)
    listener.close()
    del store
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert time.time() - start < 30
    if peer == "store without peers":
        assert (f"rank 1: the process group at 127.0.0.1:{port} did not form within 3 s (--timeout-s)"
                in result.stderr), result.stderr
    else:
        assert f"rank 1: cannot join the process group at 127.0.0.1:{port}" in result.stderr


def test_a_lone_rank_takes_any_free_port(ganc_bin, datasets, tmp_path):
    """A world-size-1 `ganc train` without MASTER_PORT serves its store on a port the OS picks:
    two lone runs side by side both train (both once took torchrun's default port, 29500, and
    the second failed with EADDRINUSE). The test holds no port itself: other runs share the
    machine."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK")}
    runs = [subprocess.Popen([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(tmp_path / f"o{i}"), 200)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err


def test_run_holds_the_store_port_until_rank_0_serves_it(ganc_bin, datasets, tmp_path):
    """`ganc run` picks the ranks' store port and holds it, listening, until rank 0 serves the
    store on that very socket: from the moment the ranks exist no other process can bind the
    port. (A launcher that found a free port, let it go and had rank 0 bind it again a second
    later lost it to a run beside it on a GPU machine: EADDRINUSE, and the run failed.) The test
    tries to take the port for 3 s from the ranks' start (their start-up, the group forming,
    the first steps of a long run), then stops the run with Ctrl-C: it must have trained."""
    import socket
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    run = subprocess.Popen([ganc_bin, "run", "--nproc", "2",
                            *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "out"), 10 ** 6)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port, tries, taken = None, 0, []
    deadline = time.time() + 60
    while run.poll() is None and time.time() < deadline:
        if port is None:  # the ranks' MASTER_PORT, once they have exec'd
            for pid in subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True).stdout.split():
                try:
                    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                except OSError:
                    continue
                port = next((int(v.split(b"=", 1)[1]) for v in env if v.startswith(b"MASTER_PORT=")), port)
            window = time.time() + 3
            continue
        if time.time() > window:
            break
        tries += 1
        thief = socket.socket()
        try:
            thief.bind(("127.0.0.1", port))
            taken.append(tries)  # held for the rest of the test: rank 0 would fail to serve on it
            break
        except OSError:
            thief.close()
        time.sleep(0.01)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=300)
    assert port is not None and tries > 0, "the test never saw the ranks' port"
    assert not taken, f"the store's port {port} was free at try {taken[0]} while the ranks started: {err}"
    assert run.returncode == 128 + signal.SIGINT, err
    assert "training mlp: 2 ranks" in out, out  # the group formed: rank 0 served the store


def test_run_prints_an_input_error_once(ganc_bin, tmp_path):
    """Every rank finds the same bad input; `ganc run` says it once, not once per rank."""
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    missing = str(tmp_path / "missing.pt")
    result = subprocess.run([ganc_bin, "run", "--nproc", "2",
                             *train_args(plan, "dcgan32", missing, str(tmp_path / "out"), 2)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("ganc: error:") == 1, result.stderr
    assert missing in result.stderr, result.stderr


@pytest.mark.parametrize("nproc", ["0", "2x", "100000"])
def test_run_refuses_a_rank_count_it_cannot_start(ganc_bin, tmp_path, nproc):
    """A count that is not one, or so many local ranks that they would exhaust the machine (a
    process holding LibTorch each) before a step: one line, exit 2, no rank started."""
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    result = subprocess.run([ganc_bin, "run", "--nproc", nproc,
                             *train_args(plan, "dcgan32", "unused.pt", str(tmp_path / "out"), 2)],
                            capture_output=True, text=True, timeout=60)
    most = max(8, 4 * os.cpu_count())
    says = (f"--nproc 100000 is more local ranks than this machine's {os.cpu_count()} cores can run "
            f"(at most {most})") if nproc == "100000" else "--nproc N (N >= 1) says how many local ranks"
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_a_killed_rank_stops_the_others(ganc_bin, datasets, tmp_path):
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    proc = subprocess.Popen([ganc_bin, "run", "--nproc", "3",
                             *train_args(plan, "dcgan32", datasets["digits"], str(tmp_path / "o"),
                                         100000, "--checkpoint-every", "0")],
                            stderr=subprocess.PIPE, text=True)
    children = started_ranks(proc, 3)
    os.kill(children[1], signal.SIGKILL)
    start = time.time()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert time.time() - start < 30
    assert "was killed by signal" in err and "stopping the other ranks" in err
    # The survivors say what Gloo's failure means, without its source path and advice.
    assert "gloo/" not in err and "GLHF" not in err, err


def _running(pid):
    """Whether `pid` is a live process (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["sigterm", "sigint", "sigkill"])
def test_stopping_the_launcher_stops_its_ranks(ganc_bin, datasets, tmp_path, sig):
    """SIGTERM or SIGINT to `ganc run` alone is forwarded to the ranks as that signal (their
    line names the signal sent: SIGINT was said as SIGTERM); a launcher killed outright takes
    its ranks with it (they die with their parent): no orphaned rank trains on, and nothing is
    left in the temporary folder (the ranks' error files are unlinked from the start)."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([ganc_bin, "run", "--nproc", "2",
                             *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "o"), 10**7,
                                         "--checkpoint-every", "0", "--tensorboard", "off")],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmp)))
    children = started_ranks(proc, 2)
    assert all(_running(c) for c in children)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    deadline = time.time() + 20
    while any(_running(c) for c in children) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_running(c) for c in children), "a rank outlived its launcher"
    assert os.listdir(tmp) == [], "the launcher left files behind"
    if sig != signal.SIGKILL:
        assert "stopping the ranks" in err, err
        said = "SIGINT" if sig == signal.SIGINT else "SIGTERM"
        assert f"ganc: {said}: stopped after step" in err, err
        assert proc.returncode == 128 + sig, (proc.returncode, err)


def test_ctrl_c_checkpoints_the_step_reached_and_resume_continues_exactly(ganc_bin, datasets, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, launcher and ranks) stops both ranks after
    the same step, writes checkpoint.pt there and exits 130; `--resume auto` then continues
    from that step and ends equal, bit for bit, to a run that was never stopped. A second
    stop by SIGTERM (a scheduler, torchrun) does the same and exits 143."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = str(tmp_path / "o")
    args = train_args(plan, "mlp", datasets["ring"], out, 10**6, "--checkpoint-every", "100000",
                      "--tensorboard", "off")
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        extra = ["--resume", "auto"] if sig == signal.SIGTERM else []
        proc = subprocess.Popen([ganc_bin, "run", "--nproc", "2", *args, *extra], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        started_ranks(proc, 2)
        time.sleep(2)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == code, err
        reached = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["step"]
        assert reached > 0 and f"stopped after step {reached} of 1000000" in err, err
        assert json.load(open(os.path.join(out, "summary.json")))["images"] > 0
    steps = reached + 3
    resumed = subprocess.run([ganc_bin, "run", "--nproc", "2",
                              *train_args(plan, "mlp", datasets["ring"], out, steps, "--tensorboard", "off",
                                          "--resume", "auto")], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0 and f"at step {reached}" in resumed.stdout, resumed.stderr
    straight = str(tmp_path / "straight")
    subprocess.run([ganc_bin, "run", "--nproc", "2", *train_args(plan, "mlp", datasets["ring"], straight, steps,
                                                                  "--tensorboard", "off")], check=True)
    a = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))
    b = ganc.load_checkpoint(os.path.join(straight, "checkpoint.pt"))
    assert a["step"] == b["step"] == steps
    for sub in ("generator", "discriminator"):
        for name, t in b[sub].items():
            assert torch.equal(a[sub][name], t), f"{sub}.{name} differs after the stop and resume"


def test_ctrl_c_stops_cleanly_beside_the_tensorboard_writer_and_through_the_python_api(ganc_bin, datasets,
                                                                                        tmp_path):
    """Ctrl-C at a terminal (SIGINT to the whole process group) while the TensorBoard writer
    follows the run: the stop line names SIGINT and nothing else is said (the writer printed a
    KeyboardInterrupt traceback and "Fatal Python error: _enter_buffered_busy"). Through
    `ganc.train` the same Ctrl-C reaches Python too, which passed it on as SIGTERM: the run
    named SIGTERM for a SIGINT."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = str(tmp_path / "o")
    proc = subprocess.Popen([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], out, 10**6,
                                                          "--checkpoint-every", "100000")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    started_ranks(proc, 1)  # the writer, its child
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    assert re.fullmatch(r"ganc: SIGINT: stopped after step \d+ of 1000000[^\n]*\n", err), err

    script = tmp_path / "train.py"
    script.write_text(f"import ganc\nganc.train({plan!r}, model={archive('mlp')!r}, data={datasets['ring']!r}, "
                      f"out={str(tmp_path / 'api')!r}, steps=10**6, sample_every=0, checkpoint_every=100000, "
                      "quiet=True)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=dict(os.environ))
    launcher = started_ranks(proc, 1)[0]
    deadline = time.time() + 60
    while time.time() < deadline and not subprocess.run(["pgrep", "-P", str(launcher)],
                                                        capture_output=True).stdout:
        time.sleep(0.2)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    assert "SIGINT: stopped after step" in err and "SIGTERM" not in err, err
    assert "Fatal Python error" not in err and err.count("Traceback") <= 1, err  # Python's own KeyboardInterrupt


@pytest.mark.parametrize("log_every,says", [
    ("1", "step 1: the loss is"),  # caught when the losses are read
    ("1000", "step 1: the loss is"),  # caught when a checkpoint writes the losses since the log
], ids=["loss", "checkpoint"])
def test_non_finite_training_stops_and_keeps_the_last_checkpoint(ganc_bin, datasets, tmp_path, log_every,
                                                                 says):
    """A learning rate far too large (9e5) makes the weights and the loss overflow: training
    stops with exit 1 saying where, and the checkpoint of the earlier good run (that --force
    replaced) is kept, as checkpoint-replaced.pt."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    good = subprocess.run([ganc_bin, "run", "--nproc", "1",
                           *train_args(plan, "mlp", datasets["ring"], str(out), 4, "--checkpoint-every", "4")],
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    checkpoint = (out / "checkpoint.pt").read_bytes()
    bad = subprocess.run([ganc_bin, "run", "--nproc", "1",
                          *train_args(plan, "mlp", datasets["ring"], str(out), 20, "--checkpoint-every", "2",
                                      "--log-every", log_every, "--force", "--lr", "9e5")],
                         capture_output=True, text=True)
    assert bad.returncode == 1, bad.stderr
    assert says in bad.stderr, bad.stderr
    assert (out / "checkpoint-replaced.pt").read_bytes() == checkpoint
    assert not (out / "checkpoint.pt").exists()


def test_a_lone_rank_whose_peer_dies_exits_with_a_message(ganc_bin, datasets, tmp_path):
    """Under torchrun or SLURM nobody kills the survivors: the collective must fail, not hang."""
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    from ganc.reference import free_port
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    args = train_args(plan, "dcgan32", datasets["digits"], str(tmp_path / "o"), 100000,
                      "--checkpoint-every", "0", "--timeout-s", "20")
    ranks = [subprocess.Popen([ganc_bin, "train", *args], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    time.sleep(6)
    ranks[1].kill()
    _, err = ranks[0].communicate(timeout=60)
    assert ranks[0].returncode == 1
    assert re.search(r"rank 0, step \d+: phase '[dg]': (the connection to another rank was lost \(.*\): that rank "
                     r"stopped; its own messages say why|a collective with the other ranks timed out)", err), err
    assert "gloo/" not in err and "GLHF" not in err and err.count("\n") == 1, err


def test_plan_for_another_model_is_refused(ganc_bin, datasets, tmp_path):
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    r = subprocess.run([ganc_bin, "train", plan, "--model", archive("probe_nograd"),
                        "--data", datasets["ring"], "--steps", "1"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "was compiled from another model" in r.stderr and len(r.stderr.splitlines()) == 1


def _damage(path, how):
    data = bytearray(open(path, "rb").read())
    if how == "truncated":
        data = data[: len(data) // 2]
    else:  # one bit flipped in the middle: a tensor's bytes
        data[len(data) // 2] ^= 0x10
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("what,how,says", [
    ("checkpoint", "truncated", "not a zip archive (the container torch writes), or truncated"),
    ("checkpoint", "flipped", "damaged file"),
    ("data", "truncated", "not a zip archive (the container torch writes), or truncated"),
    ("data", "flipped", "CRC-32 mismatch (the file is corrupted)"),
    ("model", "flipped", "CRC-32 mismatch (the file is corrupted)"),
    ("plan", "edited", "the plan was changed after it was written (checksum mismatch)"),
])
def test_damaged_files_are_refused_before_anything_runs(ganc_bin, datasets, tmp_path, what, how, says):
    """A truncated or bit-flipped checkpoint, data file or model archive, or a plan edited by
    hand, is refused with one line and exit 2 before LibTorch parses it (LibTorch's reader
    reads past a truncated buffer, and loads flipped bytes as they are: training went on to
    NaN). Checkpoints also carry a CRC-32 of the whole file."""
    import shutil
    model = str(tmp_path / "mlp.pt")
    shutil.copy(archive("mlp"), model)
    data = str(tmp_path / "ring.pt")
    shutil.copy(datasets["ring"], data)
    plan = str(tmp_path / "mlp.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True)
    first = str(tmp_path / "first")
    subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", data, "--steps", "2", "--out", first,
                    "--checkpoint-every", "2", "--sample-every", "0"], check=True, capture_output=True)
    checkpoint = os.path.join(first, "checkpoint.pt")
    if what == "plan":
        text = open(plan).read().replace("bucket_cap 26214400", "bucket_cap 1")
        open(plan, "w").write(text)
    else:
        _damage({"checkpoint": checkpoint, "data": data, "model": model}[what], how)
    out = tmp_path / "again"
    result = subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", data, "--steps", "4",
                             "--out", str(out), "--resume", checkpoint, "--sample-every", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and says in result.stderr, result.stderr
    assert not (out / "checkpoint.pt").exists()


def test_a_full_disk_fails_the_write_and_keeps_the_last_checkpoint(ganc_bin, datasets, tmp_path):
    """--out on a 200 KiB tmpfs: the first checkpoint (about 136 KiB) fits, the second cannot
    (its temporary file is written beside the first). The run stops with exit 1 and the OS's
    reason, the temporary file is gone, and the first checkpoint is intact."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}): the full-disk case "
                    "needs root")
    try:
        plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
        result = subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(disk), 4,
                                                                "--checkpoint-every", "2", "--tensorboard", "off")],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 1, result.stderr
        assert "checkpoint-0000004.pt (No space left on device)" in result.stderr, result.stderr
        # No temporary file left; the run directory's lock file stays (it holds no lock now).
        assert sorted(os.listdir(disk)) == [".ganc-lock", "checkpoint-0000002.pt", "checkpoint.pt", "loss_history.csv",
                                            "plan.ganc", "run.json", "stats.jsonl"]
        import ganc
        assert ganc.load_checkpoint(str(disk / "checkpoint.pt"))["step"] == 2
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_the_loss_history_survives_kill_9(ganc_bin, datasets, tmp_path):
    """loss_history.csv is flushed at every log step: a rank killed outright (no chance to
    close files) leaves every logged row on disk."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    proc = subprocess.Popen([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(out), 10**7,
                                                            "--checkpoint-every", "0", "--log-every", "5")],
                            stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step 20/"):
            break
    proc.kill()
    proc.wait(timeout=30)
    rows = (out / "loss_history.csv").read_text().splitlines()
    assert rows[0] == "step,phase,loss" and len(rows) >= 1 + 2 * 20, len(rows)


def test_skip_policy_trains_through_non_finite_steps(ganc_bin, datasets, tmp_path):
    """--non-finite skip on data with two samples beyond float32's range: the steps whose
    gradients overflow are skipped and counted, training finishes with exit 0 and a finite
    checkpoint (the default policy stops on the same data)."""
    import ganc
    data = torch.load(datasets["ring"])
    data = (data["images"] if isinstance(data, dict) else data).clone()
    data[[5, 300]] *= 3e38
    huge = str(tmp_path / "huge.pt")
    torch.save(data, huge)
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    result = subprocess.run([ganc_bin, "run", "--nproc", "2",
                             *train_args(plan, "mlp", huge, str(out), 20, "--checkpoint-every", "20",
                                         "--non-finite", "skip", "--log-every", "10")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    skipped = json.load(open(out / "timing.json"))["skipped_steps"]
    assert 0 < skipped["d"] < 20 and skipped["g"] == 0, skipped
    assert re.search(r"phase 'd': \d+ optimizer steps? skipped \(non-finite gradients\)", result.stdout)
    ckpt = ganc.load_checkpoint(str(out / "checkpoint.pt"))
    assert all(torch.isfinite(t).all() for sub in ("generator", "discriminator") for t in ckpt[sub].values())
    stopped = subprocess.run([ganc_bin, "run", "--nproc", "2",
                              *train_args(plan, "mlp", huge, str(tmp_path / "stop"), 20, "--log-every", "1")],
                             capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 1 and "the loss is nan" in stopped.stderr, stopped.stderr


def test_data_holding_nan_or_inf_is_refused_before_any_step(ganc_bin, datasets, tmp_path):
    """A NaN or inf in the data would stop training at the first step that draws it: it is
    refused at start, in one error line (once, from 2 ranks) naming the first such sample and
    the phase, with exit 2 and nothing written; where every phase reading data skips non-finite steps, it is a warning
    and training runs."""
    data = torch.load(datasets["ring"])
    data = (data["images"] if isinstance(data, dict) else data).double()
    data[7, 0] = float("nan")
    data[100, 1] = float("inf")
    data[2000, 0] = 1e39  # float64 past float32's range: inf once loaded as float32
    bad = str(tmp_path / "bad.pt")
    torch.save(data, bad)
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    stopped = subprocess.run([ganc_bin, "run", "--nproc", "2",
                              *train_args(plan, "mlp", bad, str(tmp_path / "stop"), 4)],
                             capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 2 and [line for line in stopped.stderr.splitlines() if "error" in line] == [
        f"ganc: error: --data {bad}: sample 7 and 2 more hold NaN or inf values (as float32): phase 'd' "
        "would stop at the first step that draws one; fix the data, or skip such steps (--non-finite skip)"], \
        stopped.stderr
    assert not (tmp_path / "stop" / "checkpoint.pt").exists()
    skipped = subprocess.run([ganc_bin, "run", "--nproc", "1",
                              *train_args(plan, "mlp", bad, str(tmp_path / "skip"), 4, "--non-finite", "skip")],
                             capture_output=True, text=True, timeout=300)
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stderr.strip().splitlines() == [
        f"ganc: warning: --data {bad}: sample 7 and 2 more hold NaN or inf values (as float32): "
        "the steps that draw them are skipped"]


def plan_text(ganc_bin, tmp_path, model):
    """A freshly compiled plan's text without its checksum line, ready to edit."""
    text = open(compile_plan(ganc_bin, model, str(tmp_path))).read()
    return text[:text.rindex("// checksum")]


def checked_in(ganc_bin, tmp_path, text):
    """An edited plan text checked in again with ganc-opt -o (verified, new checksum)."""
    source, checked = str(tmp_path / "edited.ganc"), str(tmp_path / "edited.plan")
    open(source, "w").write(text)
    subprocess.run([os.path.join(os.path.dirname(ganc_bin), "ganc-opt"), source, "-o", checked], check=True)
    return checked


def test_an_edited_plan_trains_as_edited(ganc_bin, datasets, tmp_path):
    """The plan is what trains: an interval and a learning rate edited into a plan (and checked
    in again with ganc-opt -o) take effect, where the archive's spec once won silently. The
    plan's spec holds no phase fact that a phase attribute holds (each is written once)."""
    text = plan_text(ganc_bin, tmp_path, "mlp")
    phase_g = text.index("phase @g {")
    edited = text[:phase_g] + text[phase_g:].replace("interval 1", "interval 2", 1)
    assert edited != text
    line = next(l for l in edited.splitlines() if l.strip().startswith("spec "))
    spec = json.loads(json.loads(line.strip()[len("spec "):]))  # a quoted JSON text
    assert all("interval" not in p and "precision" not in p for p in spec["phases"])
    spec["optimizers"].setdefault("discriminator", {"type": "adam"})["lr"] = 0.125
    spec_line = "  spec " + json.dumps(json.dumps(spec))
    edited = edited.replace(line, spec_line)
    checked = checked_in(ganc_bin, tmp_path, edited)
    out = str(tmp_path / "run")
    subprocess.run([ganc_bin, "run", "--nproc", "1", *train_args(checked, "mlp", datasets["ring"], out, 5)],
                   check=True, capture_output=True)
    rows = [line.split(",") for line in open(os.path.join(out, "loss_history.csv")).read().split("\n")[1:] if line]
    assert sorted(int(step) for step, phase, _ in rows if phase == "g") == [0, 2, 4]
    assert sorted(int(step) for step, phase, _ in rows if phase == "d") == [0, 1, 2, 3, 4]
    effective = json.load(open(os.path.join(out, "run.json")))["spec"]
    assert effective["phases"][1]["interval"] == 2
    assert effective["optimizers"]["discriminator"]["lr"] == 0.125
    # A spec edited wrong in the plan is refused before any step, as the archive's would be.
    spec["optimizers"]["discriminator"]["lr"] = -1
    checked = checked_in(ganc_bin, tmp_path, edited.replace(spec_line, "  spec " + json.dumps(json.dumps(spec))))
    bad = subprocess.run([ganc_bin, "train", *train_args(checked, "mlp", datasets["ring"], out + "2", 5)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
    assert "the plan's spec" in bad.stderr and "'lr' must be a number > 0" in bad.stderr, bad.stderr


def test_a_run_directory_holds_one_run_at_a_time(ganc_bin, datasets, tmp_path):
    """A second run on an --out that a live run holds (even with --force or --resume auto) is
    refused in one line naming the holder, and the live run's files are untouched; the lock
    dies with its process (kill -9 leaves none behind)."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = str(tmp_path / "o")
    first = subprocess.Popen([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], out, 10**7,
                                                            "--checkpoint-every", "0", "--tensorboard", "off")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(out, "run.json")) and time.time() < deadline:
        time.sleep(0.2)
    record = open(os.path.join(out, "run.json")).read()
    for extra in (["--force"], ["--resume", "auto"]):
        second = subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], out, 2, *extra)],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and len(second.stderr.splitlines()) == 1, second.stderr
        assert f"is in use by another run (pid {first.pid})" in second.stderr, second.stderr
    assert open(os.path.join(out, "run.json")).read() == record
    first.kill()
    first.wait()
    again = subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], out, 2, "--force")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr


def test_a_fifo_in_place_of_a_file_is_refused_not_waited_on(ganc_bin, datasets, tmp_path):
    """A FIFO given as the model, plan, spec, data or checkpoint: opening it for reading waited
    for a writer, and every command hung. Each is now one line naming it, exit 2."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    base = lambda out, **swap: train_args(swap.get("plan", plan), "mlp", swap.get("data", datasets["ring"]),
                                          str(tmp_path / out), 1)
    model = base("m")
    model[model.index("--model") + 1] = fifo
    for args in (["compile", fifo, "-o", str(tmp_path / "x.plan")], ["spec", fifo], ["explain", fifo],
                 ["train", *base("p", plan=fifo)], ["train", *model], ["train", *base("d", data=fifo)],
                 ["train", *base("r"), "--resume", fifo]):
        r = subprocess.run([ganc_bin, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and f"{fifo}: not a regular file" in r.stderr and r.stderr.count("\n") == 1, \
            (args, r.stderr)
    with pytest.raises(ValueError, match="fifo: not a regular file"):
        ganc.load_checkpoint(fifo)


def test_complex_samples_are_refused_before_training(ganc_bin, datasets, tmp_path):
    """A complex-valued data file trained on its real parts (the conversion only warned)."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    ring = torch.load(datasets["ring"])
    path = str(tmp_path / "complex.pt")
    torch.save(torch.complex(ring, torch.zeros_like(ring)), path)
    r = subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", path, str(tmp_path / "o"), 1)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--data {path}: samples are ComplexFloat: ganc trains on real-valued samples" in r.stderr, r.stderr


def test_deep_json_and_numbers_past_their_type_are_refused_in_one_line(ganc_bin, tmp_path):
    """100,000 levels of nesting in a spec or a dataset.json, WORLD_SIZE and RANK past 2^31 and
    ganc_spec 2^32 + 1: one short line and exit 2 each, never a crash, a wrapped-around number
    or a 40 KB message."""
    deep = "[" * 100000 + "]" * 100000
    r = subprocess.run([ganc_bin, "spec", "-"], input=deep, capture_output=True, text=True)
    assert r.returncode == 2 and "nested deeper than 64 levels" in r.stderr and len(r.stderr) < 300, r.stderr[:300]
    # `ganc spec --each` read its list with the unguarded parser: rc 139 on this input.
    (tmp_path / "deep.json").write_text(deep)
    r = subprocess.run([ganc_bin, "spec", "--each", str(tmp_path / "deep.json")], capture_output=True, text=True)
    assert r.returncode == 2 and "deep.json: JSON nested deeper than 64 levels" in r.stderr, r.stderr[:300]
    (tmp_path / "bad.json").write_text("[{]")
    r = subprocess.run([ganc_bin, "spec", "--each", str(tmp_path / "bad.json")], capture_output=True, text=True)
    assert r.returncode == 2 and "bad.json: not valid JSON (" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    spec = json.dumps({"ganc_spec": 2**32 + 1, "name": "x", "batch_size": 1, "data": {"shape": [1]},
                       "phases": []})
    r = subprocess.run([ganc_bin, "spec", "-"], input=spec, capture_output=True, text=True)
    assert r.returncode == 2 and "'ganc_spec' is 4294967297" in r.stderr, r.stderr
    folder = tmp_path / "images"
    folder.mkdir()
    from PIL import Image
    Image.new("RGB", (32, 32)).save(folder / "a.png")
    (folder / "dataset.json").write_text("[" * 100000 + "]" * 100000)
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    r = subprocess.run([ganc_bin, "train", *train_args(plan, "dcgan32", str(folder), str(tmp_path / "o"), 1)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr[:300]
    assert "dataset.json: JSON nested deeper than 64 levels" in r.stderr and len(r.stderr) < 300
    for name in ("WORLD_SIZE", "RANK"):
        env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", name: str(2**31 + 1)}
        r = subprocess.run([ganc_bin, "train", *train_args(plan, "dcgan32", str(folder), str(tmp_path / "p"), 1)],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and f"{name}='2147483649' is not a number from" in r.stderr, r.stderr


def test_resume_auto_takes_the_newest_whole_snapshot_and_history_follows_on(ganc_bin, datasets, tmp_path):
    """--resume auto with checkpoint.pt damaged resumes the newest whole step snapshot and says
    so (a stray checkpoint-<23 digits>.pt is not ours and is ignored). Resuming an older
    snapshot: the history from that step on is dropped (no duplicate rows) and rotation keeps
    this run's newest snapshot, not the later one of the run it replaced."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    args = lambda steps, *extra: train_args(plan, "mlp", datasets["ring"], str(out), steps, "--tensorboard", "off",
                                            "--log-every", "1", *extra)
    subprocess.run([ganc_bin, "train", *args(6, "--checkpoint-every", "2", "--keep-checkpoints", "3")],
                   check=True, capture_output=True)
    (out / ("checkpoint-" + "9" * 23 + ".pt")).write_bytes(b"not ours")
    data = bytearray((out / "checkpoint.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / "checkpoint.pt").write_bytes(bytes(data))
    # checkpoint.pt is a hard link to checkpoint-0000006.pt: both are damaged, step 4 is whole.
    r = subprocess.run([ganc_bin, "train", *args(8, "--checkpoint-every", "2", "--keep-checkpoints", "10",
                                                  "--resume", "auto")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "checkpoint.pt is damaged" in r.stdout and "resuming from checkpoint-0000004.pt" in r.stdout, r.stdout

    r = subprocess.run([ganc_bin, "train", *args(4, "--checkpoint-every", "2", "--keep-checkpoints", "1",
                                                  "--resume", str(out / "checkpoint-0000002.pt"))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (out / "checkpoint-0000004.pt").read_bytes() == (out / "checkpoint.pt").read_bytes()
    assert not (out / "checkpoint-0000002.pt").exists() and (out / "checkpoint-0000008.pt").exists()
    rows = [tuple(line.split(",")[:2]) for line in (out / "loss_history.csv").read_text().splitlines()[1:]]
    assert sorted(rows) == sorted((str(s), p) for s in range(4) for p in ("d", "g")), rows
    steps = [json.loads(line)["step"] for line in (out / "stats.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], steps


def test_resume_auto_with_every_checkpoint_damaged_stops_and_deletes_nothing(ganc_bin, datasets, tmp_path):
    """With checkpoint.pt and every step snapshot damaged, --resume auto once started over at
    step 0 and its rotation deleted the damaged snapshots; now it stops in one line, touching
    nothing. A staged checkpoint.pt.link a killed run left is removed by the next run."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    args = lambda steps, *extra: train_args(plan, "mlp", datasets["ring"], str(out), steps, "--tensorboard", "off",
                                            "--checkpoint-every", "2", "--keep-checkpoints", "2", *extra)
    subprocess.run([ganc_bin, "train", *args(4)], check=True, capture_output=True)
    for name in ("checkpoint.pt", "checkpoint-0000002.pt"):  # checkpoint.pt is step 4's hard link
        data = bytearray((out / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (out / name).write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".ganc-lock"}
    r = subprocess.run([ganc_bin, "train", *args(8, "--resume", "auto")], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert re.search(r"--resume auto: checkpoint.pt is damaged \(.*\) and no step snapshot is whole \(2 in .*; "
                     r"checkpoint-000000[24].pt: .*\); nothing was changed", r.stderr), r.stderr
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".ganc-lock"}
    assert after == before

    fresh = tmp_path / "fresh"
    subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(fresh), 2,
                                                   "--tensorboard", "off", "--checkpoint-every", "2",
                                                   "--keep-checkpoints", "2")], check=True, capture_output=True)
    os.link(fresh / "checkpoint-0000002.pt", fresh / "checkpoint.pt.link")
    r = subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(fresh), 4,
                                                       "--tensorboard", "off", "--checkpoint-every", "2",
                                                       "--keep-checkpoints", "2", "--resume", "auto")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not (fresh / "checkpoint.pt.link").exists()


@pytest.mark.parametrize("reader", ["load_checkpoint", "stylegan_snapshot"])
def test_the_python_readers_check_the_checkpoints_seal(ganc_bin, datasets, tmp_path, reader):
    """One flipped byte in a tensor's data: torch.load reads it without a word (a parameter
    off by the flip), so ganc.load_checkpoint and ganc.stylegan_snapshot check the CRC-32 seal
    and the entries' CRCs as --resume does, and name the file."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(out), 1,
                                                   "--tensorboard", "off")], check=True, capture_output=True)
    path = out / "checkpoint.pt"
    good = ganc.load_checkpoint(str(path))
    data = bytearray(path.read_bytes())
    weight = next(iter(good["generator"].values()))
    raw = weight.detach().contiguous().numpy().tobytes()
    at = bytes(data).find(raw)
    assert at > 0
    data[at + 2] ^= 0x40
    path.write_bytes(bytes(data))
    flipped = torch.load(str(path), weights_only=False)  # what torch reads: no error, another value
    assert not torch.equal(next(iter(flipped["generator"].values())), weight)
    with pytest.raises(ValueError) as info:
        if reader == "load_checkpoint":
            ganc.load_checkpoint(str(path))
        else:
            ganc.stylegan_snapshot(str(path), str(tmp_path / "pkl"), generator=torch.nn.Linear(1, 1))
    message = str(info.value)
    assert re.search(rf"^ganc.{reader}: .*checkpoint.pt is damaged: (the file's CRC-32 does not match its seal|"
                     r"entry .*CRC)", message), message
    assert not (tmp_path / "pkl").exists()


def test_a_checkpoint_is_checked_before_it_is_resumed(ganc_bin, datasets, tmp_path):
    """A checkpoint of another format version, missing an entry, with a tensor of another shape
    or holding NaN (edited in Python and saved with torch.save) is refused at start-up in one
    line naming the file and the entry, not by a PyTorch assert or 60 steps later."""
    import copy
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    first = str(tmp_path / "first")
    subprocess.run([ganc_bin, "run", "--nproc", "1", *train_args(plan, "mlp", datasets["ring"], first, 3,
                    "--checkpoint-every", "3")], check=True, capture_output=True)
    good = ganc.load_checkpoint(os.path.join(first, "checkpoint.pt"))
    name = next(iter(good["generator"]))
    cases = [
        (lambda c: c.pop("version"), "has no 'version' (not a whole ganc checkpoint)"),
        (lambda c: c.update(version=2),
         "is a version 2 checkpoint; this ganc reads version 1 (it was written by a newer ganc)"),
        (lambda c: c["generator"].pop(name), f"has no tensor 'generator.{name}' (a parameter"),
        (lambda c: c["generator"].update({name: c["generator"][name][:1]}), f"'generator.{name}' is [1"),
        (lambda c: c["generator"][name].view(-1)[0].fill_(float("nan")),
         f"'generator.{name}' holds NaN or inf values"),
        (lambda c: c["optimizers"].pop("generator"), "has no optimizer state for group 'generator'"),
    ]
    for i, (edit, message) in enumerate(cases):
        checkpoint = copy.deepcopy(good)
        edit(checkpoint)
        path = str(tmp_path / f"edited{i}.pt")
        torch.save(checkpoint, path)
        r = subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(tmp_path / f"again{i}"),
                                                           6, "--resume", path)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert f"--resume {path}: {message}" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # Saved again unedited from Python, it resumes.
    path = str(tmp_path / "resaved.pt")
    torch.save(good, path)
    r = subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "resaved"), 4,
                                                       "--resume", path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "at step 3" in r.stdout, r.stderr


def test_ranks_that_resume_different_checkpoints_stop(ganc_bin, datasets, tmp_path):
    """Node-local run directories with different contents: rank 0 resumes step 3, rank 1 finds
    nothing and would start at step 0. Every rank stops in one line naming each rank's start."""
    import socket
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    first = str(tmp_path / "first")
    subprocess.run([ganc_bin, "run", "--nproc", "1", *train_args(plan, "mlp", datasets["ring"], first, 3,
                    "--checkpoint-every", "3")], check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank, extra in ((0, ["--resume", os.path.join(first, "checkpoint.pt")]), (1, ["--resume", "auto"])):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        ranks.append(subprocess.Popen([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"],
                                                                      str(tmp_path / f"node{rank}"), 6,
                                                                      "--timeout-s", "60", *extra)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in ranks:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 2, err
        assert "the ranks do not start from the same checkpoint: rank 0 at step 3 (checkpoint " in err, err
        assert "rank 1 at step 0 (no checkpoint); give every rank the same --resume" in err, err
        assert len(err.strip().splitlines()) == 1, err


def test_a_sample_block_that_cannot_draw_is_refused_before_training(ganc_bin, datasets, tmp_path):
    """A plan whose spec points the sample grid at the discriminator would fail at the first
    sample step (step 500 by default): the sampler is run once on a batch at start-up."""
    text = plan_text(ganc_bin, tmp_path, "mlp")
    line = next(l for l in text.splitlines() if l.strip().startswith("spec "))
    spec = json.loads(json.loads(line.strip()[len("spec "):]))
    spec["sample"]["submodule"] = "discriminator"
    edited = checked_in(ganc_bin, tmp_path, text.replace(line, "  spec " + json.dumps(json.dumps(spec))))
    args = [edited, "--model", archive("mlp"), "--data", datasets["ring"], "--steps", "3", "--out",
            str(tmp_path / "run"), "--tensorboard", "off"]
    r = subprocess.run([ganc_bin, "train", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "spec sample: discriminator.forward on noise of shape [" in r.stderr, r.stderr
    assert "so the first sample grid would" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "step " not in r.stdout
    r = subprocess.run([ganc_bin, "train", *args, "--sample-every", "0", "--force"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_path_that_is_not_utf8_is_refused_at_start(ganc_bin, datasets, tmp_path):
    """run.json and summary.json record paths as JSON text: a path that is not UTF-8 once
    trained to the end and failed writing summary.json (exit 1)."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = os.fsencode(str(tmp_path)) + b"/run\xff\xfe"
    r = subprocess.run([os.fsencode(ganc_bin), b"train", os.fsencode(plan), b"--model", os.fsencode(archive("mlp")),
                        b"--data", os.fsencode(datasets["ring"]), b"--steps", b"2", b"--out", out],
                       capture_output=True, timeout=120)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2, err
    assert "the path is not valid UTF-8" in err and err.count("\n") == 1, err
    assert not os.path.exists(out)


def test_tensorboard_follows_a_resume_and_a_dead_writer_is_reported(ganc_bin, datasets, tmp_path):
    """A resumed run's writer sends only what follows the resumed step, and TensorBoard drops
    the earlier run's events past it (a SessionLog START): each step once. A writer killed
    mid-run is reported in one warning and the run trains on."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "run"
    args = train_args(plan, "mlp", datasets["ring"], str(out), 6, "--log-every", "1", "--checkpoint-every", "3")
    subprocess.run([ganc_bin, "train", *args], check=True, capture_output=True, timeout=120)
    subprocess.run([ganc_bin, "train", *args, "--resume", str(out / "checkpoint-0000003.pt")], check=True,
                   capture_output=True, timeout=120)
    events = EventAccumulator(str(out), size_guidance={"scalars": 0})
    events.Reload()
    stats = [json.loads(line) for line in (out / "stats.jsonl").read_text().splitlines()]
    assert [(e.step, e.value) for e in events.Scalars("Loss/d")] == [
        (s["step"], pytest.approx(s["Loss/d"]["mean"], rel=1e-6)) for s in stats]
    assert [s["step"] for s in stats] == [1, 2, 3, 4, 5, 6]

    live = subprocess.Popen([ganc_bin, "train", *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "live"),
                                                            10**7, "--log-every", "1", "--checkpoint-every", "0")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    writer, deadline = None, time.time() + 60
    while writer is None and time.time() < deadline:
        found = subprocess.run(["pgrep", "-P", str(live.pid), "-f", "ganc.tensorboard"], capture_output=True,
                               text=True).stdout.split()
        writer = int(found[0]) if found else None
        time.sleep(0.2)
    assert writer, "no TensorBoard writer beside the run"
    os.kill(writer, signal.SIGKILL)
    time.sleep(3)
    assert live.poll() is None, "the run ended with its writer"
    live.send_signal(signal.SIGINT)
    _, err = live.communicate(timeout=60)
    assert live.returncode == 130, err
    assert "ganc: warning: the TensorBoard writer killed by Killed; TensorBoard is off for the rest of this run" \
        in err, err
    assert err.count("TensorBoard writer") == 1, err


def test_symlinks_in_an_image_folder(ganc_bin, tmp_path):
    """A folder reached through two links is read once; a link back into a folder it lies in
    (a loop) or out of the data folder is refused in one line naming it (it once hung with
    3.7 GB, read images 41 times or read the sibling folders)."""
    from PIL import Image
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    for i in range(40):
        Image.new("RGB", (32, 32), (i * 6, 0, 255 - i * 6)).save(root / "a" / f"{i:03d}.png")
    os.symlink("a", root / "again")
    args = [plan, "--model", archive("dcgan32"), "--steps", "1", "--sample-every", "0", "--tensorboard", "off"]
    r = subprocess.run([ganc_bin, "train", *args, "--data", str(root), "--out", str(tmp_path / "ok")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ", 40 samples;" in r.stdout, r.stdout
    for name, target, says in (("self", ".", "self leads back to a folder it lies in (a symlink loop)"),
                               ("up", "../..", "up is a symlink to " + os.path.realpath(tmp_path) + ", outside the data folder")):
        os.symlink(target, root / "a" / name)
        r = subprocess.run([ganc_bin, "train", *args, "--data", str(root), "--out", str(tmp_path / name)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        os.unlink(root / "a" / name)


# Runs a command and prints its peak resident memory (KiB) as the last line of stderr.
PEAK_RSS = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
            "sys.exit(r.returncode)")


def test_a_zip_bomb_and_an_oversized_image_are_refused_before_inflating(ganc_bin, tmp_path):
    """A zip whose entry declares 256 MiB in a few hundred kilobytes, or a small PNG of 12000 x
    12000 pixels, once took gigabytes per rank before failing: refused from the declared sizes,
    in one line, before anything is inflated or decoded."""
    import zipfile
    from PIL import Image
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(33):
            Image.new("RGB", (32, 32)).save(tmp_path / "small.png")
            z.write(tmp_path / "small.png", f"{i:03d}.png")
        with z.open("big.png", "w", force_zip64=True) as f:
            chunk = bytes(1 << 20)
            for _ in range(256):
                f.write(chunk)
    assert bomb.stat().st_size < 2 << 20
    huge = tmp_path / "huge"
    huge.mkdir()
    Image.new("L", (12000, 12000)).save(huge / "huge.png")
    for i in range(33):
        Image.new("RGB", (32, 32)).save(huge / f"{i:03d}.png")
    args = [plan, "--model", archive("dcgan32"), "--steps", "1", "--sample-every", "0", "--tensorboard", "off"]
    for data, says in ((bomb, "its entries would inflate to 256 MiB, more than the"),
                       (huge, "huge.png is 12000x12000 pixels, more than ganc decodes for 32x32 samples")):
        r = subprocess.run([sys.executable, "-c", PEAK_RSS, ganc_bin, "train", *args, "--data", str(data),
                            "--out", str(tmp_path / ("out-" + data.name))], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()  # ganc's line, then the peak resident KiB
        errors = [line for line in lines if line.startswith("ganc: error: ")]
        assert len(errors) == 1 and says in errors[0], r.stderr
        assert int(lines[-1]) < 1500 * 1024, f"{lines[-1]} KiB resident"  # LibTorch alone is ~500 MB


def test_a_plan_edited_to_call_another_method_is_refused_at_start(ganc_bin, datasets, tmp_path):
    """A plan whose phase d was edited to call phase_g (and checked in again) once failed at
    step 0, or trained g's code with d's facts where the inputs matched: refused at start-up."""
    text = plan_text(ganc_bin, tmp_path, "mlp")
    phase_d = text.index("phase @d {")
    edited = text[:phase_d] + text[phase_d:].replace('method "phase_d"', 'method "phase_g"', 1)
    assert edited != text
    checked = checked_in(ganc_bin, tmp_path, edited)
    r = subprocess.run([ganc_bin, "train", *train_args(checked, "mlp", datasets["ring"], str(tmp_path / "run"), 3)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "phase 'd': the plan calls method 'phase_g', and its graph was lowered from 'phase_d'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "step " not in r.stdout, r.stderr


def test_staging_past_the_machines_memory_is_refused_before_allocating(ganc_bin, datasets, tmp_path):
    """4096 micro-batches of 1797 images (84 GiB of staged batches) once went to the OOM
    killer: refused at start-up in one line, before anything is allocated."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if memory > 2 * 84.3 * 2**30:
        pytest.skip(f"this machine has {memory / 2**30:.0f} GiB: 84 GiB of staging fits in half of it")
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    r = subprocess.run([ganc_bin, "train", *train_args(plan, "dcgan32", datasets["digits"], str(tmp_path / "run"), 2,
                                                       "--batch-size", "1797", "--accumulate", "d=4096",
                                                       "--tensorboard", "off")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "staging 4096 micro-batches of [1797, 3, 32, 32] takes 84.2 GiB, more than half this machine's" \
        in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
