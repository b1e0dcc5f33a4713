"""Runtime behaviour: exact resume, checkpoints Python can load, image folders. (Faults: test_faults.py.)"""
import json
import os
import subprocess

import pytest
import torch

import ganc
from conftest import TIMING_FIELDS, archive, compile_plan, train_args


# pggan_quick: resumed at step 4, in the middle of the 16x16 fade-in, and trained on across
# the switch to 32x32 at step 6. dcgan32_scaled: resumed at step 5, with its loss scaler
# backed off by the overflowing first steps (its scale and growth tracker are checkpointed).
# dcgan32_augment: dropout and augmentation inside the phases (the generator they draw from
# is checkpointed per rank). stylegan2: each rank's path-length mean (a local buffer the Greg
# loss reads, run again at step 8) is checkpointed per rank.
@pytest.mark.parametrize("model,steps,split", [("dcgan32", 8, 4), ("pggan_quick", 8, 4),
                                               ("dcgan32_scaled", 10, 5), ("dcgan32_augment", 8, 4),
                                               ("mlp_schedules", 8, 3), ("stylegan2", 9, 5)])
def test_resume_continues_exactly(ganc_bin, datasets, tmp_path, model, steps, split):
    plan = compile_plan(ganc_bin, model, str(tmp_path))
    data = datasets["ring" if model.startswith("mlp") else "digits"]
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
    # The image count (kimg) continues across the resume, counted once over the ranks.
    assert a["images"] == b["images"] > 0
    assert json.load(open(os.path.join(resumed, "summary.json")))["images"] == a["images"]
    for sub in ("generator", "discriminator"):
        for name, t in a[sub].items():
            assert torch.equal(t, b[sub][name]), f"{sub}.{name} differs after resume"
    # With local buffers, every rank's (rank 0's are also the state dicts' above).
    assert len(a["rank_buffers"]) == len(b["rank_buffers"]) == 2
    for rank, (mine, theirs) in enumerate(zip(a["rank_buffers"], b["rank_buffers"])):
        assert mine.keys() == theirs.keys()
        for name, t in mine.items():
            assert torch.equal(t, theirs[name]), f"rank {rank}'s {name} differs after resume"
    if model == "stylegan2":
        ranks = a["rank_buffers"]
        assert not torch.equal(ranks[0]["pl_mean"], ranks[1]["pl_mean"]), "the ranks' path-length means are alike"
        assert torch.equal(ranks[0]["pl_mean"], a["model"]["pl_mean"])
    for sub, opt in a["optimizers"].items():
        for name, state in opt["state"].items():
            for key, t in state.items():
                assert torch.equal(t, b["optimizers"][sub]["state"][name][key])
    assert a["loss_scalers"].keys() == b["loss_scalers"].keys()
    # stats.jsonl's last line carries each loss scaler's scale as the run ended.
    with open(os.path.join(straight, "stats.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    for name, state in a["loss_scalers"].items():
        assert last[f"LossScale/{name}"] == float(state["scale"]), name
    for name, state in a["loss_scalers"].items():
        for key, t in state.items():
            assert torch.equal(t, b["loss_scalers"][name][key]), f"loss scaler {name}: {key} differs"


@pytest.mark.parametrize("half_life,follows", [("0", True), (None, False)])
def test_an_ema_half_life_of_0_makes_g_ema_follow_g(ganc_bin, datasets, tmp_path, half_life, follows):
    """`--ema-half-life-images 0` is beta 0, as documented: after every step G_ema equals G
    (it once kept the spec's averaging). Without the option the spec's half-life averages."""
    plan = compile_plan(ganc_bin, "mlp_ema", str(tmp_path))
    out = str(tmp_path / "out")
    extra = ["--ema-half-life-images", half_life] if half_life else []
    subprocess.run([ganc_bin, "run", "--nproc", "1", *train_args(plan, "mlp_ema", datasets["ring"], out, 3, *extra)],
                   check=True)
    checkpoint = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))
    pairs = [(t, checkpoint["generator_ema"][name]) for name, t in checkpoint["generator"].items()]
    assert pairs and checkpoint["step"] == 3
    assert all(torch.equal(g, ema) for g, ema in pairs) == follows
    effective = json.load(open(os.path.join(out, "run.json")))
    if half_life:
        assert effective["spec"]["ema"]["beta"] == 0.0, effective["spec"]["ema"]


def test_timing_lists_every_field_on_cpu(ganc_bin, datasets, tmp_path):
    """timing.json on CPU: the fields CUDA runs write too (test_cuda checks those), a value per
    step, a host time per phase run, no replays and no captured graphs."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    out = str(tmp_path / "run")
    subprocess.run([ganc_bin, "run", "--nproc", "1", *train_args(plan, "mlp", datasets["ring"], out, 3)],
                   check=True)
    t = json.load(open(os.path.join(out, "timing.json")))
    assert set(t) == TIMING_FIELDS
    assert t["device"] == "cpu"
    assert len(t["step_seconds"]) == len(t["work_seconds"]) == len(t["overhead_seconds"]) == 3
    assert len(t["run_host_seconds"]) == 2 * 3  # phases d and g at every step
    assert t["replay_host_seconds"] == t["replay_launch_seconds"] == [] and t["graph_nodes"] == t["graph_branches"] == {}
    assert t["graph_memsets_as_kernels"] == t["graph_copies_as_kernels"] == {}
    assert t["kernel_time"] is None  # no --kernel-time (CUDA only)
    # Per phase: every run counted, the first left out of the medians (it sets things up).
    assert set(t["phases"]) == {"d", "g"}, t["phases"]
    for phase, p in t["phases"].items():
        assert p["runs"] == 3 and p["steady_runs"] == 2, (phase, p)
        assert 0 < p["work_seconds_median"] <= p["host_seconds_median"], (phase, p)


def test_timing_splits_the_time_by_phase(ganc_bin, datasets, tmp_path):
    """timing.json's phases: a phase run every k steps (R1 every 4 here: steps 0 and 4 of 6) is
    counted as often as it ran, so its median says what one run of it costs."""
    plan = compile_plan(ganc_bin, "r1gan", str(tmp_path))
    out = str(tmp_path / "run")
    subprocess.run([ganc_bin, "run", "--nproc", "1", *train_args(plan, "r1gan", datasets["ring"], out, 6)],
                   check=True)
    t = json.load(open(os.path.join(out, "timing.json")))
    assert {name: (p["runs"], p["steady_runs"]) for name, p in t["phases"].items()} == {
        "d": (6, 5), "dreg": (2, 1), "g": (6, 5)}, t["phases"]
    assert len(t["run_host_seconds"]) == 6 + 2 + 6
    for phase, p in t["phases"].items():
        assert 0 < p["work_seconds_median"] <= p["host_seconds_median"], (phase, p)


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


@pytest.mark.parametrize("model,exact", [("dcgan32_f64", True), ("dcgan32", False)])
def test_float64_data_reaches_a_float64_model_as_it_is(ganc_bin, tmp_path, model, exact):
    """A float64 model trains on a float64 tensor file's values themselves, not on their float32
    roundings; a float32 model gets the float32 roundings (as `tensor.float()`). Every sample
    is one image, so the staged batch (the --dump-grads input file) must hold it exactly."""
    image = torch.linspace(-1, 1, 3 * 32 * 32, dtype=torch.float64).reshape(3, 32, 32) / 3
    assert not torch.equal(image.float().double(), image)  # not representable in float32
    data = str(tmp_path / "f64.pt")
    torch.save(image.expand(64, 3, 32, 32).clone(), data)
    plan = compile_plan(ganc_bin, model, str(tmp_path))
    dump = tmp_path / "dump"
    subprocess.run([ganc_bin, "train", *train_args(plan, model, data, str(tmp_path / "out"), 1,
                                                   "--dump-grads", str(dump), "--tensorboard", "off")],
                   check=True, capture_output=True)
    real = ganc.load_checkpoint(str(dump / "inputs_step0_d.pt"))["real"]
    expected = image if exact else image.float()
    assert real.dtype == expected.dtype and torch.equal(real, expected.expand_as(real))


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


def test_one_sample_is_said_as_one(ganc_bin, tmp_path):
    """A data set of one sample: "1 sample is too few" for a batch of 64, and the start-up
    line of a run at batch 1 says "1 sample" (both once said "1 samples")."""
    data = str(tmp_path / "one.pt")
    torch.save(torch.randn(1, 2), data)
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    r = subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", data, str(tmp_path / "a"), 1)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "1 sample is too few for 1 rank of batch 64" in r.stderr, r.stderr
    r = subprocess.run([ganc_bin, "train", *train_args(plan, "mlp", data, str(tmp_path / "b"), 1, "--batch-size", "1")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert ", 1 sample;" in r.stdout and "1 samples" not in r.stdout, r.stdout


def test_the_start_up_line_says_what_runs(ganc_bin, datasets, tmp_path):
    """Rank 0 says in one line what the run is before it trains, and the progress line says
    that its img/s counts every rank."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    result = subprocess.run([ganc_bin, "run", "--nproc", "2",
                             *train_args(plan, "mlp", datasets["ring"], str(tmp_path / "o"), 4, "--log-every", "2")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("training mlp: 2 ranks (cpu, Gloo), steps 0..4, batch 64 per rank, 4096 samples; "
                        "phases: d (joint graph, ganc's executor), g (joint graph, ganc's executor)"), lines[0]
    assert lines[1].startswith("step 2/4") and lines[1].endswith("img/s (all ranks)"), lines[1]


@pytest.mark.parametrize("args,says", [
    (["--dist-backend", "nccl"], "--dist-backend nccl needs --device cuda"),
    (["--device", "cuda", "--dist-backend", "gloo"], "--dist-backend gloo on CUDA needs --cuda-graphs off"),
    (["--dist-backend", "mpi"], "--dist-backend takes auto, nccl or gloo, not 'mpi'"),
    (["--device", "cuda", "--dist-backend", "gloo", "--cuda-graphs", "step"],
     "--dist-backend gloo on CUDA needs --cuda-graphs off"),
    (["--cuda-graphs", "phase"], "--cuda-graphs takes on, off or step, not 'phase'"),
    (["--kernel-time", "4"], "--kernel-time traces GPU kernels: it needs --device cuda"),
    (["--comm-stream", "compute"], "--comm-stream compute places NCCL's collectives on a CUDA stream: it "
                                   "needs --device cuda with NCCL"),
    (["--device", "cuda", "--dist-backend", "gloo", "--cuda-graphs", "off", "--comm-stream", "side"],
     "--comm-stream side places NCCL's collectives on a CUDA stream: it needs --device cuda with NCCL"),
    (["--comm-stream", "nccl"], "--comm-stream takes auto, side or compute, not 'nccl'"),
    (["--memset-nodes", "keep"], "--memset-nodes keep changes captured CUDA Graphs: it needs --device cuda with "
                                 "--cuda-graphs on or step"),
    (["--device", "cuda", "--cuda-graphs", "off", "--memset-nodes", "keep"], "--memset-nodes keep changes captured"),
    (["--device", "cuda", "--memset-nodes", "fill"], "--memset-nodes takes kernel or keep, not 'fill'"),
    (["--copy-nodes", "keep"], "--copy-nodes keep changes captured CUDA Graphs: it needs --device cuda with "
                               "--cuda-graphs on or step"),
    (["--device", "cuda", "--cuda-graphs", "off", "--copy-nodes", "keep"], "--copy-nodes keep changes captured"),
    (["--device", "cuda", "--copy-nodes", "memcpy"], "--copy-nodes takes kernel or keep, not 'memcpy'"),
    (["--upload-stream", "compute"], "--upload-stream compute places the data batch's host-to-device copy on a "
                                     "CUDA stream: it needs --device cuda"),
    (["--device", "cuda", "--upload-stream", "side"], "--upload-stream takes copy or compute, not 'side'"),
    (["--device", "cuda", "--kernel-time", "0"], "--kernel-time takes an integer from 1 to"),
    (["--device", "cuda", "--kernel-trace", "t.json"], "--kernel-trace FILE writes the --kernel-time window's"),
])
def test_dist_backend_refusals_are_one_line(ganc_bin, datasets, tmp_path, args, says):
    """Combinations that cannot run are refused before any rank starts (no GPU needed)."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    r = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", archive("mlp"), "--data",
                        datasets["ring"], "--steps", "1", "--out", str(tmp_path / "out"), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_dist_backend_is_recorded(ganc_bin, datasets, tmp_path):
    """The backend a run used is in run.json and the start line (`auto` on CPU is Gloo), and so
    is --cuda-graphs (on a CPU it changes nothing)."""
    import json
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    for backend, graphs in (("auto", "on"), ("gloo", "step")):
        out = tmp_path / backend
        r = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", archive("mlp"), "--data",
                            datasets["ring"], "--steps", "2", "--out", str(out), "--tensorboard", "off",
                            "--sample-every", "0", "--dist-backend", backend, "--cuda-graphs", graphs],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "(cpu, Gloo)" in r.stdout
        options = json.load(open(out / "run.json"))["options"]
        assert options["dist_backend"] == "gloo" and options["cuda_graphs"] == graphs
        assert options["comm_stream"] == "auto" and options["upload_stream"] == "copy"
        assert options["memset_nodes"] == options["copy_nodes"] == "kernel"
