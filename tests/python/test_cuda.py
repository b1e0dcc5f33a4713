"""GPU tests of the CUDA backend (NCCL, whole-phase CUDA Graph capture and replay).

They need a CUDA GPU and are reported as skipped, with the reason, on machines without one
(CI has none). On a GPU machine, for DCGAN-32, the MLP GAN, WGAN-GP, StyleGAN2 (all four
phases: path length and R1 by double backward inside the graph), the progressive GAN
across its stage switches, DCGAN-32 with the training-step features (autocast, loss
scaling, accumulation, clipping), DCGAN-32 with synchronised batch norm and DCGAN-32 with
dropout and augmentation in its phases:

- replay: N iterations replayed from the captured graphs equal N eager iterations of the
  same plan (both with --deterministic, so cuDNN picks the same algorithms on both sides);
- parity: ganc on NCCL against eager PyTorch DDP on NCCL at world size 1, every all-reduced
  gradient and every parameter after the run, both sides deterministic;
- spread: with cuDNN's default (non-deterministic, benchmark) algorithms, ganc's distance
  from eager DDP is no larger than eager DDP's distance from itself on a second run;
- a phase with a host sync falls back to eager with its reason printed once;
- the gradient all-reduces on NCCL's own stream or on the compute stream train bit for bit
  alike, and on the compute stream each captured phase is one straight line of nodes; so do
  the data batches uploaded on a copy stream of their own or on the compute stream;
- 2 ranks sharing the GPU over Gloo (NCCL takes one GPU per rank): against eager DDP with 2
  ranks on it over Gloo, and sharded optimizer state (zero 1 and 2) against unsharded, with
  the checkpoint's gathered state; ganc's synchronised batch norm against eager DDP with
  torch.nn.SyncBatchNorm, 2 ranks on the GPU over Gloo.

Measured distances are printed, and written to $GANC_GPU_REPORT/test_cuda.json when set.
"""
import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

import ganc
from ganc import reference
from conftest import ROOT, TIMING_FIELDS, archive, gradient_dumps, tensors_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU on this machine; the CUDA Graph tests need one")

# (archive, dataset, steps, reference reducer per phase). The step counts make every phase
# run at least twice after its one warm-up iteration, so replays are compared too: WGAN-GP's
# G phase runs every 5 steps, StyleGAN2's Dreg every 16, the progressive GAN changes stage
# every 3 steps (each stage's phases are warmed up and captured anew).
MODELS = [
    ("dcgan32", "digits", 10, "ddp"),
    ("mlp", "ring", 10, "ddp"),
    ("wgan_gp", "ring", 16, "ddp"),
    # Eager DDP fails on Greg and Dreg (a bias without a gradient): DDP's arithmetic by hand.
    ("stylegan2", "digits", 33, {"Greg": "manual", "Dreg": "manual"}),
    ("pggan_quick", "digits", 10, "ddp"),
    # Training-step features inside the captured graphs: bfloat16 autocast, a loss scaler,
    # D accumulating 2 micro-batches, G clipped (the reference: torch.autocast("cuda"),
    # GradScaler, no_sync(), clip_grad_norm_); and dropout and augmentation drawn inside the
    # phases from the graph-safe CUDA generator.
    ("dcgan32_amp", "digits", 10, "ddp"),
    # float16 autocast with a loss scaler starting at 2^24: the first steps overflow inside the
    # replayed graphs, the fused optimizers skip them on the found-inf flag and the scale backs
    # off on the device (the reference: GradScaler).
    ("dcgan32_scaled", "digits", 10, "ddp"),
    ("dcgan32_augment", "digits", 10, "ddp"),
    # Learning-rate schedules read by the fused kernels from a device tensor; PyTorch's own
    # spectral and weight norm; FreezeD with optimizer groups; a branch on data (eager).
    ("mlp_schedules", "ring", 10, "ddp"),
    ("sndcgan32", "digits", 10, "ddp"),
    ("dcgan32_freezed", "digits", 10, "ddp"),
    ("mlp_branch", "ring", 10, "ddp"),
    # A D step that logs scores besides its loss: the values are outputs of the captured graph.
    ("mlp_stats", "ring", 10, "ddp"),
    # Synchronised batch norm in G: at world size 1 ganc::sync_batch_norm is batch norm, as
    # SyncBatchNorm is, so eager DDP with the model's BatchNorm is the reference.
    ("dcgan32_syncbn", "digits", 10, "ddp"),
    # All five training-step features in one captured phase each (bfloat16 autocast).
    ("dcgan32_all", "digits", 10, "ddp"),
    # BigGAN's generator: conditional batch norms (affine=False), class embeddings, nearest
    # upsampling; projection D, hinge loss.
    ("biggan32", "digits", 10, "ddp"),
]
EAGER_MODELS = {"mlp_branch"}
SEED = 7
# The replay and parity tests of a model share one captured run (see captured_run): grouped,
# `pytest -n N --dist loadgroup` gives both to one worker, which trains it once.
GROUPED = [pytest.param(*m, marks=pytest.mark.xdist_group(m[0]), id=m[0]) for m in MODELS]


def report(key, value):
    print(f"{key}: {value}")
    where = os.environ.get("GANC_GPU_REPORT")
    if not where:
        return
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, f"test_cuda_{os.getpid()}.json")
    data = json.load(open(path)) if os.path.exists(path) else {}
    data[key] = value
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def train_cuda(ganc_bin, model, data, out, steps, *extra, nproc=1, dump=True, stdout=False):
    """`ganc run` on the GPU; returns the gradient dump directory (rank 0's gradients of every
    phase run and the final parameters) and stderr (with stdout=True, stdout then stderr), or,
    with dump=False, the run directory (a checkpoint at the end, no dumps) and stdout."""
    os.makedirs(out, exist_ok=True)
    plan = os.path.join(out, model + ".plan")
    subprocess.run([ganc_bin, "compile", archive(model), "-o", plan], check=True)
    dump_dir, run_dir = os.path.join(out, "dump"), os.path.join(out, "train")
    # scripts/gpu_check.sh's fallback where the default failed its smoke run (e.g. "--memset-nodes
    # keep"): before the test's own options, which win where they name the same one.
    fallback = os.environ.get("GANC_GPU_TRAIN_ARGS", "").split()
    r = subprocess.run([ganc_bin, "run", "--nproc", str(nproc), plan, "--model", archive(model), "--data", data,
                        *fallback, "--device", "cuda", "--steps", str(steps), "--seed", str(SEED),
                        "--out", run_dir, "--sample-every", "0",
                        "--checkpoint-every", "0" if dump else str(steps), "--log-every", str(steps),
                        *(["--dump-grads", dump_dir] if dump else []), *extra],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return (dump_dir, r.stdout + r.stderr if stdout else r.stderr) if dump else (run_dir, r.stdout)


def loss_difference(got_run, ref_run):
    """The first row of two runs' loss_history.csv that differs, as (got, ref), or None: the
    logged losses are the values the host reads after each step, which the checkpoint does
    not hold (a graph output overwritten before it is read leaves the weights alone)."""
    rows = [open(os.path.join(d, "loss_history.csv")).read().splitlines() for d in (got_run, ref_run)]
    for got, ref in itertools.zip_longest(*rows):
        if got != ref:
            return got, ref
    return None


def relative(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def distances(got_dir, ref_dir, spec, steps, ref_loader=torch.load):
    """The largest relative gradient and parameter differences, after checking that both
    sides gave gradients to the same parameters in every phase run; also where the
    gradients first differ (step, phase, parameter, difference), or None."""
    grad, compared, first = 0.0, 0, None
    for step, phase, got, ref in gradient_dumps(spec, steps, got_dir, ref_dir, ref_loader):
        for p in ref:
            err = relative(got[p], ref[p])
            if err > 0 and first is None:
                first = (step, phase, p, err)
            grad = max(grad, err)
            compared += 1
    assert compared > 0
    got = ganc.load_checkpoint(os.path.join(got_dir, "params_final.pt"))
    ref = ref_loader(os.path.join(ref_dir, "params_final.pt"))
    assert set(got) == set(ref)
    param = max(relative(got[p], ref[p]) for p in ref)
    return grad, param, first


# First the tests of the newest CUDA paths (one launch per step, the collectives' stream, the
# memset pass, the timing and the data upload's stream): a run that scripts/gpu_check.sh's
# --deadline cuts short on a GPU machine's short lease has checked them.


def checkpoint_tensors(run_dir):
    """Every tensor of a run's last checkpoint by its path in the file."""
    return dict(tensors_of(ganc.load_checkpoint(os.path.join(run_dir, "checkpoint.pt"))))


def differing_tensors(run_dir, ref_dir):
    """The paths of the tensors in two runs' last checkpoints that are not bitwise equal (the
    two must hold the same tensors)."""
    got, ref = checkpoint_tensors(run_dir), checkpoint_tensors(ref_dir)
    assert set(got) == set(ref)
    return sorted(k for k in ref if not torch.equal(got[k], ref[k]))


# --cuda-graphs step: each step's phases, once all are captured, launched as one graph made
# of theirs. The models where a step's phase pattern changes (StyleGAN2's lazy Greg and
# Dreg), stages bring new captures (the progressive GAN), random numbers are drawn inside the
# phases (augmentation, dropout) and the training-step features run (dcgan32_all_f64).
STEP_MODELS = [("stylegan2", "digits", 33), ("pggan_quick", "digits", 10),
               ("dcgan32_augment", "digits", 10), ("dcgan32_all_f64", "digits", 10)]


@pytest.mark.parametrize("model,dataset,steps", STEP_MODELS, ids=[m[0] for m in STEP_MODELS])
def test_step_graphs_train_like_eager(ganc_bin, datasets, tmp_path, model, dataset, steps):
    """One launch per step against every phase run eagerly: the final checkpoint (weights,
    optimizer and scaler state, the generators' states) and every logged loss."""
    step_run, out = train_cuda(ganc_bin, model, datasets[dataset], str(tmp_path / "step"), steps,
                               "--cuda-graphs", "step", "--warmup", "1", "--deterministic", dump=False)
    assert "one launch per step" in out, out  # after the fusion lines of a model that fuses
    eager_run, _ = train_cuda(ganc_bin, model, datasets[dataset], str(tmp_path / "eager"), steps,
                              "--cuda-graphs", "off", "--deterministic", dump=False)
    got, ref = checkpoint_tensors(step_run), checkpoint_tensors(eager_run)
    assert set(got) == set(ref)
    worst = max((relative(got[k], ref[k]) if ref[k].is_floating_point() else float(not torch.equal(got[k], ref[k])),
                 k) for k in ref)
    losses = loss_difference(step_run, eager_run)
    report(f"step_graphs_vs_eager/{model}", {"worst": worst, "first_loss_difference": losses})
    assert worst[0] <= 1e-6, f"step graphs differ from eager at {worst[1]} by {worst[0]:.2e}"
    assert losses is None, f"the logged losses differ: step graphs {losses[0]!r}, eager {losses[1]!r}"


# --comm-stream: the gradient collectives on NCCL's own stream (side) or in order on the
# compute stream (compute; auto at world size 1). The models: plain all-reduces (DCGAN-32),
# and a loss scaler, accumulation and clipping beside them (dcgan32_all_f64).
COMM_MODELS = [("dcgan32", "digits", 10), ("dcgan32_all_f64", "digits", 10)]


@pytest.mark.parametrize("model,dataset,steps", COMM_MODELS, ids=[m[0] for m in COMM_MODELS])
def test_collectives_on_either_stream_train_alike(ganc_bin, datasets, tmp_path, model, dataset, steps):
    """The same training bit for bit with the collectives on either stream; on the compute
    stream every captured phase is one straight line of nodes (no branches)."""
    runs, branches = {}, {}
    for stream in ("side", "compute"):
        runs[stream], _ = train_cuda(ganc_bin, model, datasets[dataset], str(tmp_path / stream), steps,
                                     "--comm-stream", stream, "--warmup", "1", "--deterministic", dump=False)
        branches[stream] = json.load(open(os.path.join(runs[stream], "timing.json")))["graph_branches"]
    differ = differing_tensors(runs["compute"], runs["side"])
    losses = [open(os.path.join(runs[s], "loss_history.csv")).read() for s in ("compute", "side")]
    report(f"comm_stream/{model}", {"branches": branches, "differ": differ[:5], "losses_equal": losses[0] == losses[1]})
    assert not differ, f"{len(differ)} tensors differ, first {differ[0]}"
    assert losses[0] == losses[1]
    assert branches["compute"] and all(b == 0 for b in branches["compute"].values()), branches


# --memset-nodes and --copy-nodes: the captured graphs' memset nodes (PyTorch's reductions
# clearing their semaphores, cuDNN its workspaces) and their copies within the GPU's memory
# become kernel nodes, or stay. DCGAN-32 (batch norm, convolutions) and StyleGAN2 (double
# backward, path length) have both kinds of memset.
MEMSET_MODELS = [("dcgan32", "digits", 10), ("stylegan2", "digits", 33)]


@pytest.mark.parametrize("model,dataset,steps", MEMSET_MODELS, ids=[m[0] for m in MEMSET_MODELS])
def test_memset_and_copy_nodes_as_kernels_train_alike(ganc_bin, datasets, tmp_path, model, dataset, steps):
    """The same training bit for bit with the memset and copy nodes made kernels or kept; made
    kernels, the graphs hold no memset node, fewer copy nodes, and one more kernel node for
    each node replaced."""
    runs, timing = {}, {}
    for mode in ("keep", "kernel"):
        runs[mode], _ = train_cuda(ganc_bin, model, datasets[dataset], str(tmp_path / mode), steps,
                                   "--memset-nodes", mode, "--copy-nodes", mode, "--warmup", "1",
                                   "--deterministic", dump=False)
        timing[mode] = json.load(open(os.path.join(runs[mode], "timing.json")))
    differ = differing_tensors(runs["kernel"], runs["keep"])
    losses = loss_difference(runs["kernel"], runs["keep"])
    kept, made = timing["keep"]["graph_nodes"], timing["kernel"]["graph_nodes"]
    memsets, copies = timing["kernel"]["graph_memsets_as_kernels"], timing["kernel"]["graph_copies_as_kernels"]
    report(f"memset_nodes/{model}", {"keep": kept, "kernel": made, "memsets_replaced": memsets,
                                     "copies_replaced": copies, "differ": differ[:5],
                                     "first_loss_difference": losses})
    assert not differ, f"{len(differ)} tensors differ, first {differ[0]}"
    assert losses is None, f"the logged losses differ: kernels {losses[0]!r}, memsets {losses[1]!r}"
    assert timing["keep"]["graph_memsets_as_kernels"] == {p: 0 for p in kept}, timing["keep"]
    assert timing["keep"]["graph_copies_as_kernels"] == {p: 0 for p in kept}, timing["keep"]
    assert set(made) == set(kept) == set(memsets) == set(copies), (kept, made)
    assert sum(n.get("memset", 0) for n in kept.values()) > 0, f"no memset node to replace: {kept}"
    if sum(n.get("memcpy", 0) for n in kept.values()) > 0:
        assert sum(copies.values()) > 0, f"no copy node within the GPU's memory to replace: {kept}"
    for phase in kept:
        # Each graph captured the same nodes both times (the same kernels, deterministic).
        assert memsets[phase] == kept[phase].get("memset", 0), (phase, kept[phase], memsets[phase])
        assert made[phase].get("memset", 0) == 0, (phase, made[phase])
        # Copies from or to host memory, or over 1 MiB, stay copies.
        assert made[phase].get("memcpy", 0) == kept[phase].get("memcpy", 0) - copies[phase], \
            (phase, kept[phase], made[phase], copies[phase])
        assert made[phase]["kernel"] == kept[phase]["kernel"] + memsets[phase] + copies[phase], \
            (phase, kept[phase], made[phase])
        assert made[phase]["total"] == kept[phase]["total"], (phase, kept[phase], made[phase])


# --upload-stream: each data batch goes to the GPU on a copy stream of its own (copy) or in
# order on the compute stream (compute). DCGAN-32 (images) and BigGAN (images and labels, one
# staged batch each), their D phases captured reading the batch at a fixed address.
UPLOAD_MODELS = [("dcgan32", "digits", 10), ("biggan32", "digits", 10)]


@pytest.mark.parametrize("model,dataset,steps", UPLOAD_MODELS, ids=[m[0] for m in UPLOAD_MODELS])
def test_uploads_on_either_stream_train_alike(ganc_bin, datasets, tmp_path, model, dataset, steps):
    """The same training bit for bit, every logged loss too, with the batch uploaded beside
    the queued phases or in order before them: no phase reads a batch before it lands, or
    after the next one overwrote it."""
    runs = {}
    for stream in ("compute", "copy"):
        runs[stream], _ = train_cuda(ganc_bin, model, datasets[dataset], str(tmp_path / stream), steps,
                                     "--upload-stream", stream, "--warmup", "1", "--deterministic", dump=False)
        options = json.load(open(os.path.join(runs[stream], "run.json")))["options"]
        assert options["upload_stream"] == stream, options
    differ = differing_tensors(runs["copy"], runs["compute"])
    losses = loss_difference(runs["copy"], runs["compute"])
    report(f"upload_stream/{model}", {"differ": differ[:5], "first_loss_difference": losses})
    assert not differ, f"{len(differ)} tensors differ, first {differ[0]}"
    assert losses is None, f"the logged losses differ: copy stream {losses[0]!r}, compute stream {losses[1]!r}"


@pytest.mark.parametrize("model,captured", [("pix2pix", True), ("cyclegan_pool", False)])
def test_shared_values_on_cuda_match_eager_ddp(ganc_bin, tmp_path, model, captured):
    """pix2pix and CycleGAN on the GPU: a section computes the fakes once per step, phase d
    takes them detached and phase g back-propagates through them. pix2pix's section and phases
    are captured as one CUDA Graph and replayed: they train as eager DDP on NCCL does, and as
    ganc's own eager run does, bit for bit. CycleGAN's d decides its image pools' swaps on the
    host (a host read, so eager): its whole step then runs eagerly, each phase saying why, and
    still trains as eager DDP."""
    steps = 6
    pairs = str(tmp_path / "pairs.pt")
    subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), "pairs", "--size", "16", "-o",
                    pairs], check=True, stdout=subprocess.DEVNULL)
    spec = ganc.load_spec(archive(model))
    got, err = train_cuda(ganc_bin, model, pairs, str(tmp_path / "ganc"), steps, "--cuda-graphs", "on",
                          "--warmup", "1", "--deterministic", "--memory-format", "auto")
    if captured:
        assert "runs eagerly" not in err, err
    else:
        assert "phase 'd' runs eagerly: aten::Int" in err, err
        assert "phase 'g' runs eagerly: phase 'd' of its step runs eagerly" in err, err
    ref = str(tmp_path / "ddp")
    reference.run(archive(model), pairs, 1, steps, SEED, out_dir=ref, device="cuda", deterministic=True,
               channels_last=True)
    grad, param, first = distances(got, ref, spec, steps)
    report(f"parity_deterministic/{model}/auto", {"grad": grad, "param": param, "first_difference": first})
    assert grad <= 1e-5, f"gradients differ from eager DDP by {grad:.2e}; first at {first}"
    assert param <= 1e-5, f"parameters differ from eager DDP by {param:.2e} after {steps} steps"
    if not captured:
        return
    eager, _ = train_cuda(ganc_bin, model, pairs, str(tmp_path / "eager"), steps, "--cuda-graphs", "off",
                          "--deterministic", "--memory-format", "auto")
    grad, param, first = distances(got, eager, spec, steps, ref_loader=ganc.load_checkpoint)
    losses = loss_difference(str(tmp_path / "ganc" / "train"), str(tmp_path / "eager" / "train"))
    report(f"replay_vs_eager/{model}", {"grad": grad, "param": param, "first_difference": first,
                                        "first_loss_difference": losses})
    assert grad <= 1e-6 and param <= 1e-6, (
        f"replay differs from eager: grad {grad:.2e}, param {param:.2e}; first at {first}")
    assert losses is None, f"the logged losses differ: replayed {losses[0]!r}, eager {losses[1]!r}"


def test_fir_filters_double_backward_on_cuda_matches_eager_ddp(ganc_bin, tmp_path):
    """StyleGAN2-ADA-style networks (upfirdn2d's depthwise FIR convolutions in R1 and path
    length, unfused) on the GPU, every phase captured: the filters' double backward as ganc::convolution
    (the default), against eager DDP on NCCL with PyTorch's own double backward (which makes
    one convolution per channel), both deterministic: every all-reduced gradient and the
    final parameters."""
    steps = 17  # Dreg (every 16) eager at step 0, replayed at 16
    digits16 = str(tmp_path / "digits16.pt")
    subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), "digits", "--size", "16", "-o",
                    digits16], check=True, stdout=subprocess.DEVNULL)
    model = "stylegan2_ada"
    got, _ = train_cuda(ganc_bin, model, digits16, str(tmp_path / "ganc"), steps, "--warmup", "1",
                        "--deterministic", "--memory-format", "contiguous", "--fusion", "off")
    out = open(os.path.join(tmp_path, "ganc", "train", "run.json")).read()
    assert '"double_backward": "filters"' in out, out
    ref = str(tmp_path / "ddp")
    reference.run(archive(model), digits16, 1, steps, SEED, out_dir=ref, device="cuda", deterministic=True,
               reducer={"Gpl": "manual", "Dreg": "manual"})
    grad, param, first = distances(got, ref, ganc.load_spec(archive(model)), steps)
    report(f"parity_deterministic/{model}/filters", {"grad": grad, "param": param, "first_difference": first})
    assert grad == 0 and param == 0, f"gradients differ by {grad:.2e}, parameters by {param:.2e}; first at {first}"


def test_fused_stylegan2_ada_on_cuda_matches_eager_ddp(ganc_bin, tmp_path):
    """The same networks in float64 with the plan's fusion (the default on CUDA, --fusion auto): every resampling and
    bias + activation of the four phases runs as ganc::upfirdn2d and ganc::bias_act's CUDA
    kernels, their first and second derivatives inside the captured graphs, against eager DDP
    on NCCL running the reference compositions: every all-reduced gradient and the final
    parameters within 1e-9 (the kernels sum in another order than cuDNN's convolutions)."""
    steps = 17
    digits16 = str(tmp_path / "digits16.pt")
    subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), "digits", "--size", "16", "-o",
                    digits16], check=True, stdout=subprocess.DEVNULL)
    model = "stylegan2_ada_f64"
    got, err = train_cuda(ganc_bin, model, digits16, str(tmp_path / "ganc"), steps, "--warmup", "1",
                          "--deterministic", stdout=True)
    for phase in ("Gmain", "Gpl", "Dmain", "Dreg"):
        assert f"phase '{phase}': fused" in err, err
    assert "runs eagerly" not in err, err
    ref = str(tmp_path / "ddp")
    reference.run(archive(model), digits16, 1, steps, SEED, out_dir=ref, device="cuda", deterministic=True,
               reducer={"Gpl": "manual", "Dreg": "manual"})
    grad, param, first = distances(got, ref, ganc.load_spec(archive(model)), steps)
    report(f"parity_deterministic/{model}/fused", {"grad": grad, "param": param, "first_difference": first})
    assert grad <= 1e-9 and param <= 1e-9, f"gradients differ by {grad:.2e}, parameters by {param:.2e}; first at {first}"


def test_timing_reports_device_work(ganc_bin, datasets, tmp_path):
    """timing.json on CUDA: the same fields as on CPU, the work timed on the GPU; with
    --kernel-time, the GPU's busy time over the last steps from the CUDA profiler."""
    out = str(tmp_path)
    trace = os.path.join(out, "kernels.json")
    train_cuda(ganc_bin, "dcgan32", datasets["digits"], out, 10, "--warmup", "1", "--kernel-time", "4",
               "--kernel-trace", trace)
    t = json.load(open(os.path.join(out, "train", "timing.json")))
    assert t["device"] == "cuda"
    assert len(t["step_seconds"]) == len(t["work_seconds"]) == len(t["overhead_seconds"]) == 10
    assert all(w > 0 for w in t["work_seconds"])
    assert len(t["replay_host_seconds"]) == 2 * (10 - 2)  # both phases, after warm-up and capture
    assert set(t) == TIMING_FIELDS
    # Per phase: every run counted, the replays' GPU time the median (warm-up and capture not).
    assert {name: (p["runs"], p["steady_runs"]) for name, p in t["phases"].items()} == {
        "d": (10, 8), "g": (10, 8)}, t["phases"]
    assert all(p["work_seconds_median"] > 0 for p in t["phases"].values()), t["phases"]
    # Each captured phase's graph: its nodes by kind, kernels among them, adding up to the total.
    assert set(t["graph_nodes"]) == {"d", "g"}, t["graph_nodes"]
    for phase, nodes in t["graph_nodes"].items():
        assert nodes["kernel"] > 0 and nodes["total"] == sum(n for k, n in nodes.items() if k != "total"), nodes
    assert set(t["graph_branches"]) == {"d", "g"} and all(b >= 0 for b in t["graph_branches"].values()), t
    # The profiler saw the 4 replayed steps' kernels (each phase's graph holds some), and the
    # GPU was busy for part of their wall time.
    kernels = t["kernel_time"]
    assert kernels["steps"] == 4, kernels
    assert kernels["gpu_activities"] >= 4 * sum(n["kernel"] for n in t["graph_nodes"].values()), kernels
    assert 0 < kernels["busy_seconds"] <= kernels["wall_seconds"] <= sum(t["step_seconds"][-4:]) + 1, kernels
    # By name, longest first: the activities' own times add up to at least the busy time
    # (overlaps count once there) when every name is listed.
    top = kernels["top"]
    assert top and all(a["calls"] > 0 and a["seconds"] > 0 for a in top), top
    assert [a["seconds"] for a in top] == sorted((a["seconds"] for a in top), reverse=True), top
    if len(top) < 25:
        assert sum(a["calls"] for a in top) == kernels["gpu_activities"], kernels
        assert sum(a["seconds"] for a in top) >= kernels["busy_seconds"] * (1 - 1e-9), kernels
    # The idle gaps between the GPU's activities, by length: with the busy time they make up
    # the span from the first activity to the last, which lies within the window.
    gaps = kernels["idle_gaps"]
    assert [g["shorter_than_seconds"] for g in gaps] == [2e-6, 10e-6, 100e-6, None], gaps
    assert kernels["busy_seconds"] + sum(g["seconds"] for g in gaps) <= kernels["wall_seconds"] * 1.01, kernels
    # --kernel-trace: the window as a Chrome trace, the kernels among its events.
    assert kernels["trace_file"] == trace
    events = json.load(open(trace))["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events), {e.get("cat") for e in events}
    # Each step's data batch reaches the GPU on a copy stream of its own, beside the phases'
    # kernels (the transfer used to hold the compute stream: 60 us of a DCGAN-64 step).
    uploads = [e for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "")]
    kernel_streams = {e["args"]["stream"] for e in events if e.get("cat") == "kernel"}
    assert len(uploads) >= 4, [e.get("name") for e in events if e.get("cat") == "gpu_memcpy"]
    assert all(e["args"]["stream"] not in kernel_streams for e in uploads), (uploads, kernel_streams)
    report("timing/dcgan32", {k: t[k] for k in ("work_seconds", "step_seconds", "replay_host_seconds",
                                                 "graph_nodes", "graph_branches", "kernel_time")})


# model -> (gradient dump directory, stderr, run directory) of its captured run.
_CAPTURED = {}


def captured_run(ganc_bin, datasets, tmp_path_factory, model, dataset, steps):
    """The model trained with its phases captured and replayed (one warm-up iteration,
    deterministic cuDNN, ganc's default channels-last layout, gradients dumped), once per
    test process: the replay test compares it with ganc's eager run, the parity test with eager
    DDP, and neither changes it."""
    if model not in _CAPTURED:
        out = tmp_path_factory.mktemp(f"captured_{model}")
        # --fusion off: the parity test compares this run with eager DDP on the reference ops bit for
        # bit; ganc's fused kernels (on by default on CUDA) round otherwise, and have their own test
        # (test_fused_stylegan2_ada_on_cuda_matches_eager_ddp, float64).
        dump, err = train_cuda(ganc_bin, model, datasets[dataset], str(out), steps, "--cuda-graphs", "on",
                               "--warmup", "1", "--deterministic", "--memory-format", "auto", "--fusion", "off")
        _CAPTURED[model] = (dump, err, str(out / "train"))
    return _CAPTURED[model]


@pytest.mark.parametrize("model,dataset,steps,reducer", GROUPED)
def test_replayed_iterations_equal_eager_iterations(ganc_bin, datasets, tmp_path, tmp_path_factory, model,
                                                    dataset, steps, reducer):
    spec = ganc.load_spec(archive(model))
    replay, err, replay_run = captured_run(ganc_bin, datasets, tmp_path_factory, model, dataset, steps)
    if model in EAGER_MODELS:  # its branch on data is a host sync: every phase runs eagerly
        assert all(f"phase '{p['name']}' runs eagerly" in err for p in spec["phases"]), err
    else:
        assert "runs eagerly" not in err, err  # every phase of the others is captured
    eager, _ = train_cuda(ganc_bin, model, datasets[dataset], str(tmp_path / "eager"), steps,
                          "--cuda-graphs", "off", "--deterministic")
    grad, param, first = distances(replay, eager, spec, steps, ref_loader=ganc.load_checkpoint)
    losses = loss_difference(replay_run, str(tmp_path / "eager" / "train"))
    report(f"replay_vs_eager/{model}", {"grad": grad, "param": param, "first_difference": first,
                                        "first_loss_difference": losses})
    assert grad <= 1e-6 and param <= 1e-6, (
        f"replay differs from eager: grad {grad:.2e}, param {param:.2e}; first at {first}")
    assert losses is None, f"the logged losses differ: replayed {losses[0]!r}, eager {losses[1]!r}"


# ganc's default layout on CUDA is channels-last (--memory-format auto); the reference gets
# the same. DCGAN-32 is also checked in the NCHW layout.
PARITY = ([pytest.param(*m, "auto", marks=pytest.mark.xdist_group(m[0]), id=m[0]) for m in MODELS]
          + [pytest.param("dcgan32", "digits", 10, "ddp", "contiguous", id="dcgan32-contiguous")])


@pytest.mark.parametrize("model,dataset,steps,reducer,layout", PARITY)
def test_parity_with_eager_ddp_on_nccl(ganc_bin, datasets, tmp_path, tmp_path_factory, model, dataset, steps,
                                       reducer, layout):
    spec = ganc.load_spec(archive(model))
    if layout == "auto":  # the replay test's run
        got = captured_run(ganc_bin, datasets, tmp_path_factory, model, dataset, steps)[0]
    else:
        got, _ = train_cuda(ganc_bin, model, datasets[dataset], str(tmp_path / "ganc"), steps,
                            "--cuda-graphs", "on", "--warmup", "1", "--deterministic", "--memory-format", layout)
    ref = str(tmp_path / "ddp")
    reference.run(archive(model), datasets[dataset], 1, steps, SEED, out_dir=ref, device="cuda",
               reducer=reducer, deterministic=True, channels_last=layout == "auto")
    grad, param, first = distances(got, ref, spec, steps)
    report(f"parity_deterministic/{model}/{layout}", {"grad": grad, "param": param, "first_difference": first})
    assert grad <= 1e-5, f"gradients differ from eager DDP by {grad:.2e}; first at {first}"
    assert param <= 1e-5, f"parameters differ from eager DDP by {param:.2e} after {steps} steps"


def test_default_cudnn_spread_covers_ganc(ganc_bin, datasets, tmp_path):
    """DCGAN-32 with cuDNN's default algorithms (benchmark mode, non-deterministic
    backward): two eager DDP runs already differ; ganc must differ from them no more."""
    model, dataset, steps = "dcgan32", "digits", 10
    spec = ganc.load_spec(archive(model))
    got, _ = train_cuda(ganc_bin, model, datasets[dataset], str(tmp_path / "ganc"), steps)
    refs = []
    for i in range(2):
        refs.append(str(tmp_path / f"ddp{i}"))
        reference.run(archive(model), datasets[dataset], 1, steps, SEED, out_dir=refs[-1], device="cuda",
                   channels_last=True)
    spread = distances(refs[1], refs[0], spec, steps)[:2]
    ganc_vs = [distances(got, r, spec, steps)[:2] for r in refs]
    report("default_cudnn/dcgan32", {"eager_vs_eager": spread, "ganc_vs_eager": ganc_vs})
    # Each side's own noise: ganc is as far from either eager run as the eager runs are
    # from each other, up to a factor two for the sampling of one spread.
    allowed = 2 * max(spread[1], 1e-6)
    assert min(d[1] for d in ganc_vs) <= allowed, (
        f"ganc's parameters are {min(d[1] for d in ganc_vs):.2e} from eager DDP, eager DDP's own "
        f"run-to-run spread is {spread[1]:.2e}")


def test_host_sync_phase_falls_back_to_eager(ganc_bin, datasets, tmp_path):
    _, err = train_cuda(ganc_bin, "probe_sync", datasets["ring"], str(tmp_path), 10)
    assert err.count("phase 'g' runs eagerly: aten::Bool") == 1, err
    assert "phase 'd' runs eagerly" not in err


def test_replays_draw_the_noise_eager_runs_draw_around_other_draws(ganc_bin, datasets, tmp_path):
    """A replay skips writing the generator's seed and offset into the graph's device tensors
    when its own last node left them right; draws outside the graphs in between (probe_sync's
    eager G phase, the sample grids under a forked generator) must make it write them again.
    Replayed D phases against a run with no graphs, gradients of every phase run."""
    spec = ganc.load_spec(archive("probe_sync"))
    extra = ("--sample-every", "3", "--deterministic")
    replay, err = train_cuda(ganc_bin, "probe_sync", datasets["ring"], str(tmp_path / "graph"), 12,
                             "--cuda-graphs", "on", "--warmup", "1", *extra)
    assert "phase 'g' runs eagerly" in err and "phase 'd' runs eagerly" not in err, err
    eager, _ = train_cuda(ganc_bin, "probe_sync", datasets["ring"], str(tmp_path / "eager"), 12,
                          "--cuda-graphs", "off", *extra)
    grad, param, first = distances(replay, eager, spec, 12, ref_loader=ganc.load_checkpoint)
    report("replay_vs_eager/probe_sync_with_samples", {"grad": grad, "param": param, "first_difference": first})
    assert grad <= 1e-6 and param <= 1e-6, (
        f"replay differs from eager: grad {grad:.2e}, param {param:.2e}; first at {first}")


# Sharded optimizer state on CUDA at 2 ranks on the one GPU: NCCL will not put two ranks on
# one device, so the sharded path's device side (pieces in device buffers, found-inf flags and
# clipping norms combined across ranks, per-bucket all-gathers, the checkpoint's state
# gathered to rank 0) runs over Gloo (`--dist-backend gloo`, eagerly). NCCL's collectives and
# their capture are not covered by this; on one GPU nothing can cover them.
GLOO_ZERO = ["mlp", "dcgan32", "stylegan2", "dcgan32_scaled", "dcgan32_clip_f64"]
SHARED_GPU = ("--device", "cuda", "--dist-backend", "gloo", "--cuda-graphs", "off", "--deterministic", "--fusion", "off")


# Two ranks on the one GPU against eager DDP with two ranks on it, both over Gloo: ganc's
# multi-rank CUDA path (device bucket views, DDP's scaling, the hooks, unreached branches)
# against DDP's own on CUDA tensors.
SHARED = [("dcgan32", "digits", 10, "ddp"), ("mlp", "ring", 10, "ddp"),
          ("stylegan2", "digits", 33, {"Greg": "manual", "Dreg": "manual"}),
          ("dcgan32_amp", "digits", 10, "ddp"), ("mlp_branch", "ring", 10, "ddp")]


@pytest.mark.parametrize("model,dataset,steps,reducer", SHARED, ids=[m[0] for m in SHARED])
def test_two_ranks_on_one_gpu_match_eager_ddp(ganc_bin, datasets, tmp_path, model, dataset, steps, reducer):
    spec = ganc.load_spec(archive(model))
    got, _ = train_cuda(ganc_bin, model, datasets[dataset], str(tmp_path / "ganc"), steps, *SHARED_GPU,
                        nproc=2)
    ref = str(tmp_path / "ddp")
    reference.run(archive(model), datasets[dataset], 2, steps, SEED, out_dir=ref, device="cuda", reducer=reducer,
               deterministic=True, channels_last=True, shared_gpu=True)
    grad, param, first = distances(got, ref, spec, steps)
    report(f"two_ranks_one_gpu/{model}", {"grad": grad, "param": param, "first_difference": first})
    assert grad <= 1e-5, f"gradients differ from eager DDP by {grad:.2e}; first at {first}"
    assert param <= 1e-5, f"parameters differ from eager DDP by {param:.2e} after {steps} steps"


# ganc's synchronised batch norm against torch.nn.SyncBatchNorm itself (which refuses CPU
# tensors, so on CPU the reference is one process on the concatenated batch): 2 ranks on the
# one GPU over Gloo, where SyncBatchNorm all-gathers too. The reference runs the zoo's Python
# class with the archive's weights, its generator's BatchNorms converted by
# SyncBatchNorm.convert_sync_batchnorm. On CUDA ganc's op runs SyncBatchNorm's kernels in its
# order: bitwise equal, in float64 and under bfloat16 autocast (dcgan32_all), and for layers
# without a weight (biggan32's conditional batch norms).
TORCH_SYNC_BN = [("dcgan32_syncbn_f64", "dcgan32_syncbn"), ("dcgan32_all_f64", "dcgan32_all"),
                 ("dcgan32_all", "dcgan32_all"), ("biggan32", "biggan32")]


@pytest.mark.parametrize("model,python_model", TORCH_SYNC_BN, ids=[m[0] for m in TORCH_SYNC_BN])
def test_two_ranks_on_one_gpu_sync_batch_norm_matches_torch_syncbatchnorm(ganc_bin, datasets, tmp_path, model,
                                                                          python_model):
    import functools
    import zoo
    spec = ganc.load_spec(archive(model))
    got, _ = train_cuda(ganc_bin, model, datasets["digits"], str(tmp_path / "ganc"), 10, *SHARED_GPU, nproc=2)
    ref = str(tmp_path / "syncbn")
    reference.run(archive(model), datasets["digits"], 2, 10, SEED, out_dir=ref, device="cuda", deterministic=True,
               channels_last=True, shared_gpu=True, eager_model=functools.partial(zoo.module, python_model))
    grad, param, first = distances(got, ref, spec, 10)
    report(f"torch_syncbn/{model}", {"grad": grad, "param": param, "first_difference": first})
    assert grad == 0, f"gradients differ from DDP with torch.nn.SyncBatchNorm by {grad:.2e}; first at {first}"
    assert param == 0, f"parameters differ from DDP with torch.nn.SyncBatchNorm by {param:.2e}"


@pytest.mark.parametrize("model", GLOO_ZERO)
def test_two_ranks_on_one_gpu_shard_like_unsharded(ganc_bin, datasets, tmp_path, model):
    import test_zero
    data = datasets[test_zero.dataset_of(model)]
    unsharded = test_zero.train(ganc_bin, model, data, 2, str(tmp_path), 0, test_zero.STEPS, *SHARED_GPU)
    for zero in (1, 2):
        sharded = test_zero.train(ganc_bin, model, data, 2, str(tmp_path), zero, test_zero.STEPS, *SHARED_GPU)
        test_zero.assert_same_run(model, sharded, unsharded, (1e-6, 1e-6))


def test_two_ranks_on_one_gpu_checkpoint_the_whole_state(ganc_bin, datasets, tmp_path):
    """A sharded CUDA run's checkpoint holds the whole optimizer state (gathered from device
    pieces), equal to the unsharded run's."""
    import test_zero
    states = {}
    for zero in (0, 2):
        test_zero.train(ganc_bin, "dcgan32", datasets["digits"], 2, str(tmp_path), zero, 6, *SHARED_GPU,
                        "--checkpoint-every", "3")
        states[zero] = test_zero.optimizer_state(tmp_path / f"run-zero{zero}" / "checkpoint.pt")
    test_zero.assert_same_optimizer_state(states[2], states[0])


@pytest.mark.parametrize("graphs", ["on", "off"])
def test_gpu_profile_times_the_phases(ganc_bin, datasets, tmp_path, graphs):
    """--profile on CUDA: CUDA events recorded inside the captured graphs time every replay
    (with --cuda-graphs off, every eager run); the profile has the CPU's fields, each gradient
    ready during backward and no later than its bucket, and `ganc simulate` predicts from it."""
    out = str(tmp_path)
    profile = os.path.join(out, "profile.json")
    train_cuda(ganc_bin, "dcgan32", datasets["digits"], out, 10, "--warmup", "1", "--profile", profile,
               "--cuda-graphs", graphs)
    p = json.load(open(profile))
    plan = os.path.join(out, "dcgan32.plan")
    facts = json.loads(subprocess.run([ganc_bin, "explain", plan, "--json"], capture_output=True, text=True,
                                      check=True).stdout)
    planned = {ph["name"]: ph for ph in facts["phases"]}
    assert p["device"] == "cuda" and p["steps"] == 10 and {ph["key"] for ph in p["phases"]} == set(planned)
    for ph in p["phases"]:
        # One warm-up run and the capture (whose replay follows it at once) are not timed.
        assert ph["runs"] == 10 and ph["timed_runs"] == (10 - 2 if graphs == "on" else 10)
        bucket_of = {s["parameter"]: i for i, b in enumerate(planned[ph["key"]]["buckets"]) for s in b["slots"]}
        for b in ph["buckets"]:
            assert 0 < b["ready_seconds"] <= ph["forward_backward_seconds"] <= ph["all_reduced_seconds"]
        for q in ph["parameters"]:
            assert 0 < q["ready_seconds"] <= ph["buckets"][bucket_of[q["name"]]]["ready_seconds"]
        assert ph["optimizer_seconds"] > 0
    rows = json.loads(subprocess.run([ganc_bin, "simulate", plan, "--profile", profile, "--gpus", "1,8,64",
                                      "--json"], capture_output=True, text=True, check=True).stdout)
    assert rows[0]["efficiency"] == 1.0 and all(0 < r["efficiency"] <= 1.0 for r in rows)
    report(f"profile/dcgan32/graphs-{graphs}", {ph["key"]: {k: ph[k] for k in ("forward_backward_seconds", "optimizer_seconds")}
                               for ph in p["phases"]} | {"simulated": rows})


# -- ganc's own operators on the GPU --------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_ops_cuda_kernels_equal_the_reference_compositions(dtype):
    """ganc::upfirdn2d and ganc::bias_act's CUDA kernels against the reference compositions
    (pad + zero insertion + depthwise conv2d + slice; bias + activation + gain + clamp) on the
    GPU: forward, backward and double backward, contiguous and channels-last. float64 to
    1e-12, float32 to 1e-6, float16/bfloat16 to 4 of their rounding steps (relative to the
    largest magnitude: the kernels accumulate in float32 and round once)."""
    import test_ops
    bound = {torch.float64: 1e-12, torch.float32: 1e-6}.get(dtype, 4 * torch.finfo(dtype).eps)
    worst = {}
    torch.manual_seed(0)
    # (2, 8, 12, 10): ganc's direct kernel; images whose outputs are about 64 x 64 in 8 x 64
    # channels: past its million outputs, cuDNN's convolutions (strided, or transposed for
    # upsampling).
    cases = [(shape, up, down, padding, taps) for up, down, padding, taps in test_ops.RESAMPLINGS
             for shape in ((2, 8, 12, 10), (8, 64, 64 * down[1] // up[1], 64 * down[0] // up[0]))]
    for shape, up, down, padding, taps in cases:
        f = test_ops.fir(taps, separable=taps % 2 == 0, dtype=torch.float32).cuda()
        for layout in (torch.contiguous_format, torch.channels_last):
            x = torch.randn(*shape, device="cuda").to(dtype).to(memory_format=layout).requires_grad_()
            got = test_ops.call(x, f, up, down, padding, gain=1.5)
            want = test_ops.reference_upfirdn2d(x.double(), f.double(), up, down, padding, gain=1.5)
            cot = torch.randn_like(want).requires_grad_()
            g_got, = torch.autograd.grad(got, x, cot.to(dtype), create_graph=True)
            g_want, = torch.autograd.grad(want, x, cot, create_graph=True)
            w = torch.randn_like(g_want)
            gg_got, = torch.autograd.grad((g_got * w.to(dtype)).sum(), cot)
            gg_want, = torch.autograd.grad((g_want * w).sum(), cot)
            for name, a, b in (("forward", got, want), ("backward", g_got, g_want), ("double", gg_got, gg_want)):
                error = ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
                worst[f"upfirdn2d/{name}"] = max(worst.get(f"upfirdn2d/{name}", 0.0), error)
                assert error <= bound, (shape, up, down, padding, taps, layout, name, error)
    for act, gain, clamp in test_ops.ACTIVATIONS:
        x = torch.randn(4, 16, 6, 6, device="cuda").to(dtype).to(memory_format=torch.channels_last).requires_grad_()
        b = torch.randn(16, device="cuda").to(dtype).requires_grad_()
        got = torch.ops.ganc.bias_act(x, b, 1, act, 0.2, gain, clamp)
        want = test_ops.reference_bias_act(x, b, 1, act, 0.2, gain, clamp)
        cot = torch.randn_like(want)
        (gx, gb), (wx, wb) = torch.autograd.grad(got, (x, b), cot), torch.autograd.grad(want, (x, b), cot)
        for name, a, r in (("forward", got, want), ("dx", gx, wx), ("db", gb, wb)):
            error = ((a.double() - r.double()).abs().max() / r.double().abs().max().clamp_min(1e-30)).item()
            worst[f"bias_act/{name}"] = max(worst.get(f"bias_act/{name}", 0.0), error)
            assert error <= max(bound, 4 * torch.finfo(dtype).eps), (act, gain, clamp, name, error)
    report(f"ops/{str(dtype).removeprefix('torch.')}", worst)
