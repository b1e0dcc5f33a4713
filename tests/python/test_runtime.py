"""Runtime behaviour: exact resume, a dying rank, bad plans and bad data."""
import os
import signal
import re
import subprocess
import time

import pytest
import torch

import ganc
from conftest import archive


def compile_plan(ganc_bin, model, out):
    plan = os.path.join(out, model + ".plan")
    subprocess.run([ganc_bin, "compile", archive(model), "-o", plan], check=True)
    return plan


def train_args(plan, model, data, out, steps, *extra):
    return [plan, "--model", archive(model), "--data", data, "--steps", str(steps), "--out", out,
            "--sample-every", "0", "--log-every", "1000", *extra]


def started_ranks(launcher, n):
    """The pids of the `n` ranks `ganc run` started, once they have been training a while."""
    children = []
    deadline = time.time() + 60
    while len(children) < n and time.time() < deadline:
        out = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout
        children = [int(p) for p in out.split()]
        time.sleep(0.2)
    assert len(children) == n, "the ranks did not start"
    time.sleep(3)  # let training get going
    return children


# pggan_quick: resumed at step 4, in the middle of the 16x16 fade-in, and trained on across
# the switch to 32x32 at step 6. dcgan32_scaled: resumed at step 5, with its loss scaler
# backed off by the overflowing first steps (its scale and growth tracker are checkpointed).
# dcgan32_augment: dropout and augmentation inside the phases (the generator they draw from
# is checkpointed per rank).
@pytest.mark.parametrize("model,steps,split", [("dcgan32", 8, 4), ("pggan_quick", 8, 4),
                                               ("dcgan32_scaled", 10, 5), ("dcgan32_augment", 8, 4)])
def test_resume_continues_exactly(ganc_bin, datasets, tmp_path, model, steps, split):
    plan = compile_plan(ganc_bin, model, str(tmp_path))
    data = datasets["digits"]
    straight = str(tmp_path / "straight")
    subprocess.run([ganc_bin, "run", "--nproc", "2", *train_args(plan, model, data, straight, steps,
                    "--checkpoint-every", str(steps))], check=True)
    first = str(tmp_path / "first")
    subprocess.run([ganc_bin, "run", "--nproc", "2", *train_args(plan, model, data, first, split,
                    "--checkpoint-every", str(split))], check=True)
    resumed = str(tmp_path / "resumed")
    subprocess.run([ganc_bin, "run", "--nproc", "2", *train_args(plan, model, data, resumed, steps,
                    "--checkpoint-every", str(steps), "--resume",
                    os.path.join(first, "checkpoint.pt"))],
                   check=True)
    a = ganc.load_checkpoint(os.path.join(straight, "checkpoint.pt"))
    b = ganc.load_checkpoint(os.path.join(resumed, "checkpoint.pt"))
    assert a["step"] == b["step"] == steps
    for sub in ("generator", "discriminator"):
        for name, t in a[sub].items():
            assert torch.equal(t, b[sub][name]), f"{sub}.{name} differs after resume"
    for sub, opt in a["optimizers"].items():
        for name, state in opt["state"].items():
            for key, t in state.items():
                assert torch.equal(t, b["optimizers"][sub]["state"][name][key])
    assert a["loss_scalers"].keys() == b["loss_scalers"].keys()
    for name, state in a["loss_scalers"].items():
        for key, t in state.items():
            assert torch.equal(t, b["loss_scalers"][name][key]), f"loss scaler {name}: {key} differs"


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


@pytest.mark.parametrize("peer", ["silent listener", "nobody"])
def test_rendezvous_gives_up_with_one_line(ganc_bin, datasets, tmp_path, peer):
    """Rank 1 waiting for a rendezvous store that never answers (a port held by a listener
    that accepts and says nothing) or that is not there gives up after --timeout-s with one
    line and exit 2: no hang, no c10d stack traces."""
    import socket
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if peer == "silent listener":
        listener.listen(8)
    else:
        listener.close()
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    env.pop("TORCH_CPP_LOG_LEVEL", None)
    result = subprocess.run([ganc_bin, "train", *train_args(plan, "dcgan32", datasets["digits"],
                                                            str(tmp_path / "out"), 2, "--timeout-s", "3")],
                            env=env, capture_output=True, text=True, timeout=60)
    listener.close()
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert f"rank 1: cannot join the process group at 127.0.0.1:{port}" in result.stderr


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


def test_checkpoint_loads_into_python_modules(ganc_bin, datasets, tmp_path):
    import zoo
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    out = str(tmp_path / "run")
    subprocess.run([ganc_bin, "run", "--nproc", "1", *train_args(plan, "dcgan32", datasets["digits"], out, 2,
                    "--checkpoint-every", "2")], check=True)
    ckpt = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))
    gan = zoo.DCGAN(32, 32)
    gan.generator.load_state_dict(ckpt["generator"])
    gan.discriminator.load_state_dict(ckpt["discriminator"])
    assert ckpt["step"] == 2 and len(ckpt["rng"]["noise"]) == 1
    history = open(os.path.join(out, "loss_history.csv")).read().splitlines()
    assert history[0] == "step,phase,loss" and len(history) == 1 + 2 * 2


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


def _running(pid):
    """Whether `pid` is a live process (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_stopping_the_launcher_stops_its_ranks(ganc_bin, datasets, tmp_path, sig):
    """SIGTERM to `ganc run` is forwarded to the ranks; a launcher killed outright takes its
    ranks with it (they die with their parent): no orphaned rank trains on."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    proc = subprocess.Popen([ganc_bin, "run", "--nproc", "2",
                             *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "o"), 10**7,
                                         "--checkpoint-every", "0")],
                            stderr=subprocess.PIPE, text=True)
    children = started_ranks(proc, 2)
    assert all(_running(c) for c in children)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    deadline = time.time() + 20
    while any(_running(c) for c in children) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_running(c) for c in children), "a rank outlived its launcher"
    if sig == signal.SIGTERM:
        assert "stopping the ranks" in err, err


@pytest.mark.parametrize("log_every,says", [
    ("1", "step 0: the loss is"),  # caught when the losses are read
    ("1000", "is not finite; checkpoint.pt was not written"),  # caught before a checkpoint
], ids=["loss", "checkpoint"])
def test_non_finite_training_stops_and_keeps_the_last_checkpoint(ganc_bin, datasets, tmp_path, log_every,
                                                                 says):
    """Data beyond float32's range makes the loss and then the weights overflow: training stops
    with exit 1 saying where, and the checkpoint of the earlier good run is not overwritten."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = tmp_path / "o"
    good = subprocess.run([ganc_bin, "run", "--nproc", "1",
                           *train_args(plan, "mlp", datasets["ring"], str(out), 4, "--checkpoint-every", "4")],
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    checkpoint = (out / "checkpoint.pt").read_bytes()
    data = torch.load(datasets["ring"])
    data = data["images"] if isinstance(data, dict) else data
    huge = str(tmp_path / "huge.pt")
    torch.save(data * 3e38, huge)
    bad = subprocess.run([ganc_bin, "run", "--nproc", "1",
                          *train_args(plan, "mlp", huge, str(out), 20, "--checkpoint-every", "2",
                                      "--log-every", log_every)],
                         capture_output=True, text=True)
    assert bad.returncode == 1, bad.stderr
    assert says in bad.stderr, bad.stderr
    assert (out / "checkpoint.pt").read_bytes() == checkpoint


def test_a_lone_rank_whose_peer_dies_exits_with_a_message(ganc_bin, datasets, tmp_path):
    """Under torchrun or SLURM nobody kills the survivors: the collective must fail, not hang."""
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    from ganc.oracle import free_port
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    args = train_args(plan, "dcgan32", datasets["digits"], str(tmp_path / "o"), 100000,
                      "--checkpoint-every", "0", "--timeout-s", "20")
    ranks = [subprocess.Popen([ganc_bin, "train", *args], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    time.sleep(6)
    ranks[1].kill()
    _, err = ranks[0].communicate(timeout=60)
    assert ranks[0].returncode == 1
    assert re.search(r"rank 0, step \d+: phase '[dg]'", err), err


def test_plan_for_another_model_is_refused(ganc_bin, datasets, tmp_path):
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    r = subprocess.run([ganc_bin, "train", plan, "--model", archive("probe_nograd"),
                        "--data", datasets["ring"], "--steps", "1"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "was compiled from another model" in r.stderr and len(r.stderr.splitlines()) == 1


def test_image_folder_errors_are_one_line(ganc_bin, tmp_path):
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([ganc_bin, "train", plan, "--model", archive("dcgan32"), "--data", str(empty),
                        "--steps", "1"], capture_output=True, text=True)
    assert r.returncode == 2 and "no PNG or JPEG images" in r.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.png").write_bytes(b"not a png")
    r = subprocess.run([ganc_bin, "train", plan, "--model", archive("dcgan32"), "--data", str(broken),
                        "--steps", "1"], capture_output=True, text=True)
    assert r.returncode == 2 and "a.png: cannot decode image" in r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_image_folder_trains(ganc_bin, tmp_path):
    """PNG and JPEG files of another size are decoded, resized to the spec's 3x32x32, trained on."""
    from PIL import Image
    folder = tmp_path / "images"
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    for i in range(40):
        pixels = (torch.rand(40, 48, 3, generator=g) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / f"{i}.{'png' if i % 2 else 'jpg'}")
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp_path))
    out = tmp_path / "out"
    subprocess.run([ganc_bin, "run", "--nproc", "1", plan, "--model", archive("dcgan32"), "--data", str(folder),
                    "--steps", "2", "--out", str(out), "--sample-every", "2", "--samples", "4"], check=True)
    assert (out / "samples.png").exists()
    # Two ranks of batch 32 need at least 64 images: the error names the sizes.
    r = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", archive("dcgan32"), "--data", str(folder),
                        "--steps", "1"], capture_output=True, text=True)
    assert r.returncode == 2 and "40 samples are too few for 2 ranks of batch 32" in r.stderr
