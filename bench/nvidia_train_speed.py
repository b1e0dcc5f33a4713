"""StyleGAN2 at 256 pixels in its official configuration: ganc against NVIDIA's own train.py.

Both sides train the same networks on the same GPU, data set and per-GPU batch:

- NVIDIA: `train.py --cfg=stylegan2` of a StyleGAN3 checkout (`--repo`; kept outside the
  repository or in the git-ignored external/, never committed), unchanged, with its CUDA
  plugins (bias_act, upfirdn2d, built on first use with ninja and nvcc) and its defaults for
  that configuration: channel base `--cbase` (16384 here, the paper's 256-pixel setting),
  channel max 512, 8 mapping layers, float16 in the top 4 resolutions with conv clamp 256,
  style mixing 0.9, path length every 4 steps, R1 every 16, G_ema; `--aug=noaug --mirror=0
  --metrics=none`, through bench/nvidia_compat.py's two shims for PyTorch 2.11 (their
  sampler's constructor and their plugins' import). Seconds per kimg and peak memory are read from its own stats.jsonl
  (`Timing/sec_per_kimg`, `Resources/peak_gpu_mem_gb`), over the ticks after the first kimg.
- ganc: the same `training.networks_stylegan2` Generator and Discriminator, built from the
  options train.py prints with `--dry-run` (so every network argument is the one it trains
  with), wrapped in a module whose phases are its StyleGAN2Loss (Gmain, Greg every 4, Dmain,
  Dreg every 16, the gains, the lazy-regularisation learning rates and betas, EMA by
  batch * 10/32 kimg), exported with `ganc.export` (their files unchanged; the export traces
  on the CPU, where their two blocks would take their float32 branch, so `trace_as_on_gpu()`
  answers that one device check as on a GPU: float16 and channels-last in the top four
  resolutions, as train.py trains; their bias_act and upfirdn2d take their reference paths
  off a GPU, so ganc runs them as separate kernels where NVIDIA's run fused), compiled and
  trained with `ganc train --device cuda`, every phase captured and replayed. Seconds per kimg
  from stats.jsonl's `Progress/img_per_sec`, as below.

- ganc unfused (`--sides` naming `ganc_unfused`): the same plan trained with `--fusion off`,
  the reference resampling and bias_act replayed as the archive wrote them (ganc's default
  runs them as ganc::upfirdn2d and ganc::bias_act); `fusion_speedup` is its s/kimg over the
  fused run's.

- NVIDIA with reference ops (`--sides` naming `nvidia_ref`): train.py again, its bias_act and
  upfirdn2d made to take their reference paths (bench/nvidia_compat.py), so it runs eagerly
  the very operations ganc's archive replays. Against it, ganc's ratio says what the replay
  itself gains or loses; against train.py's, what the fused kernels are worth.

ganc's progress records come every 16 steps (one R1 step and four path-length steps each, the
mix of a kimg). Its seconds per kimg leave out the first kimg and every step until R1, the
rarest phase, has run its eager warm-ups (`--warmup`, 3) and its capture (64 steps), and the
last 16 steps, which run under the CUDA profiler (`--kernel-time`: busy time and top
kernels). Its timing.json gives each phase's median GPU time per replay: which phase the time
goes to. A run past `--limit` is stopped with SIGINT first, so what it measured is still
written.

Differences kept on purpose, none of which changes the work per step: style mixing's cutoff
is drawn as a mask (the same distribution; their `ws[:, cutoff:]` slices by a tensor), no EMA
ramp-up (the same arithmetic), the mapping's `w_avg` (used only for truncation when sampling)
is not tracked in Dmain (a traced network takes tensors by position, not `update_emas=True`;
a lerp of 512 numbers per step), and ganc does not replace non-finite gradients by zero.

With `--scaling 1,2,4,8`, a profiled ganc run at each batch (96 steps, `--profile`) and `ganc
simulate`'s prediction for those GPU counts (8 per host on NVLink, InfiniBand between hosts;
ganc's overlapped buckets and one flat all-reduce after backward), beside StyleGAN3's published
1-to-8-A100 efficiency (85 % at 256 pixels): at batch 4 per GPU, the per-GPU load of 8-GPU
strong scaling at batch 32.

Both sides' GPU memory is also sampled with nvidia-smi every 0.2 s (the process's whole use,
CUDA context and allocator cache included), so the two are read the same way.

    python bench/nvidia_train_speed.py --repo external/stylegan3 [--batches 4,32] [--kimg 3]
        [--sides nvidia,nvidia_ref,ganc,ganc_unfused] [--scaling 1,2,4,8]

Without a GPU it makes the data set, reads train.py's options, exports and compiles the model
at each batch, and stops with one line (exit 3). Results: bench/results/nvidia_train_speed.json
(machine, date, command, every number).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

from results import HERE, ROOT, MemorySampler, read_jsonl, run_until  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ganc  # noqa: E402
from ganc import recipes  # noqa: E402


def reg_intervals(options: dict) -> tuple:
    """G's and D's lazy regularisation intervals: train.py's, else training_loop's defaults."""
    return int(options.get("G_reg_interval") or 1), int(options.get("D_reg_interval", 16) or 1)


class OfficialStyleGAN2(recipes.StyleGAN2Loss):
    """NVIDIA's Generator and Discriminator, built from train.py's options, in ganc.recipes'
    StyleGAN2 loss with those options' loss settings and lazy-regularisation intervals."""

    def __init__(self, options: dict, resolution: int):
        import dnnlib
        common = dict(c_dim=0, img_resolution=resolution, img_channels=3)
        G = dnnlib.util.construct_class_by_name(**options["G_kwargs"], **common).train()
        D = dnnlib.util.construct_class_by_name(**options["D_kwargs"], **common).train()
        G_ema = dnnlib.util.construct_class_by_name(**options["G_kwargs"], **common).eval()
        G_ema.load_state_dict(G.state_dict())
        G_ema.requires_grad_(False)
        loss = options["loss_kwargs"]
        g_int, d_int = reg_intervals(options)
        p = dataclasses.replace(recipes.PRESETS["stylegan2"], gamma=float(loss["r1_gamma"]),
                                style_mixing_prob=float(loss.get("style_mixing_prob", 0.0)),
                                pl_weight=float(loss.get("pl_weight", 0.0)), pl_decay=float(loss.get("pl_decay", 0.01)),
                                pl_batch_shrink=int(loss.get("pl_batch_shrink", 2)), g_reg_interval=g_int,
                                d_reg_interval=d_int)
        super().__init__(G, D, p, G_ema)


# The lines of their blocks that send any input off a GPU down their float32 path (no float16, no
# channels-last in the top resolutions), whatever the block's use_fp16 says.
GPU_ONLY_CHECKS = {"SynthesisBlock": "if ws.device.type != 'cuda':",
                   "DiscriminatorBlock": "if (x if x is not None else img).device.type != 'cuda':"}


def trace_as_on_gpu() -> None:
    """Makes their blocks take, on this machine's CPU, the branch they take on a GPU, so that the
    export (which traces on the CPU) records the network train.py trains: float16 and
    channels-last in the top resolutions. Each block's `forward` is recompiled from their own
    source with the one device check above made `if False:`, at its own file and line numbers;
    nothing else changes, and their files are not touched. Traced off a GPU without this, ganc
    trained an all-float32 network (36.7 s/kimg at batch 32 on an H100, against their 6.69)."""
    import inspect
    import textwrap
    from training import networks_stylegan2 as nets
    for name, check in GPU_ONLY_CHECKS.items():
        cls = getattr(nets, name)
        lines, first = inspect.getsourcelines(cls.forward)
        source = textwrap.dedent("".join(lines))
        if source.count(check) != 1:
            raise SystemExit(f"{name}.forward of this checkout has no line `{check}`: cannot trace it as on a GPU")
        code = compile("\n" * (first - 1) + source.replace(check, "if False:"), inspect.getsourcefile(cls), "exec")
        scope = {}
        exec(code, vars(nets), scope)
        cls.forward = scope["forward"]


def spec(options: dict, resolution: int, batch: int) -> dict:
    """ganc's spec for train.py's options: its phases, lazy-regularisation optimizers and EMA."""
    z = {"name": "z", "source": "normal", "shape": [options["G_kwargs"]["z_dim"]]}
    real = {"name": "real", "source": "data"}

    def adam(kwargs: dict, interval: int) -> dict:
        ratio = interval / (interval + 1)  # training_loop's mb_ratio
        return {"type": "adam", "lr": kwargs["lr"] * ratio, "betas": [b ** ratio for b in kwargs["betas"]],
                "eps": kwargs["eps"]}

    g_int, d_int = reg_intervals(options)
    return {"ganc_spec": 1, "name": "stylegan2_official", "batch_size": batch,
            "data": {"shape": [3, resolution, resolution]},
            "phases": [{"name": "Gmain", "method": "phase_gmain", "updates": ["G"], "inputs": [z]},
                       {"name": "Greg", "method": "phase_greg", "updates": ["G"], "interval": g_int, "inputs": [z]},
                       {"name": "Dmain", "method": "phase_dmain", "updates": ["D"], "inputs": [real, z]},
                       {"name": "Dreg", "method": "phase_dreg", "updates": ["D"], "interval": d_int,
                        "inputs": [real]}],
            "optimizers": {"G": adam(options["G_opt_kwargs"], g_int), "D": adam(options["D_opt_kwargs"], d_int)},
            "ema": {"submodule": "G", "copy": "G_ema", "half_life_images": options["ema_kimg"] * 1000}}


def make_dataset(path: str, resolution: int, count: int) -> None:
    """A StyleGAN dataset_tool-style zip of `count` RGB PNGs (scikit-learn's digits, scaled up
    and tinted), with `"labels": null`."""
    from PIL import Image
    from sklearn.datasets import load_digits
    digits = torch.tensor(load_digits().images, dtype=torch.float32) / 16.0
    g = torch.Generator().manual_seed(0)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for i in range(count):
            d = digits[i % len(digits)][None, None]
            img = F.interpolate(d, size=(resolution, resolution), mode="bilinear", align_corners=False)[0]
            tint = torch.rand([3, 1, 1], generator=g) * 0.7 + 0.3
            rgb = (img * tint * 255).clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
            buf = io.BytesIO()
            Image.fromarray(rgb).save(buf, format="png", compress_level=0)
            z.writestr(f"{i // 1000:05d}/img{i:08d}.png", buf.getvalue())
        z.writestr("dataset.json", json.dumps({"labels": None}))


def train_py_args(repo: str, data: str, out: str, batch: int, kimg: int, cbase: int, gamma: float) -> list:
    # Their train.py itself, through two shims for PyTorch 2.11 (bench/nvidia_compat.py).
    return [sys.executable, os.path.join(HERE, "nvidia_compat.py"), os.path.join(repo, "train.py"), f"--outdir={out}", "--cfg=stylegan2", f"--data={data}",
            "--gpus=1", f"--batch={batch}", f"--gamma={gamma}", f"--cbase={cbase}", "--mirror=0", "--aug=noaug",
            "--metrics=none", f"--kimg={kimg}", "--tick=1", "--snap=1000", "--workers=2", "--seed=0"]


def dry_run_options(repo: str, data: str, batch: int, cbase: int, gamma: float) -> dict:
    """train.py's whole configuration for these settings, as `--dry-run` prints it."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(train_py_args(repo, data, out, batch, 1, cbase, gamma) + ["--dry-run"], cwd=repo,
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"train.py --dry-run failed: {done.stderr.strip().splitlines()[-1:]}")
    text = done.stdout
    start = text.index("{")
    options, _ = json.JSONDecoder().raw_decode(text[start:])
    return options


def run_nvidia(repo: str, data: str, out: str, batch: int, kimg: int, cbase: int, gamma: float, limit: float,
               reference_ops: bool = False) -> dict:
    """train.py at one batch; with `reference_ops`, its bias_act and upfirdn2d on their reference
    paths (bench/nvidia_compat.py), the operations ganc's archive holds."""
    side = "nvidia_ref" if reference_ops else "nvidia"
    log = os.path.join(out, f"{side}_b{batch}.txt")
    out = os.path.join(out, f"{side}_b{batch}")  # train.py's --outdir: a run folder in it
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env = dict(os.environ, GANC_NVIDIA_REFERENCE_OPS="1" if reference_ops else "0")
    start = time.time()
    with MemorySampler() as memory, open(log, "w") as f:
        rc = run_until(train_py_args(repo, data, out, batch, kimg, cbase, gamma), limit, f, cwd=repo, env=env)
    result = {"exit": rc, "wall_seconds": time.time() - start, "nvidia_smi_peak_gib": memory.peak_gib(),
              "reference_ops": reference_ops}
    text = open(log).read()
    result["plugins_fell_back"] = "Falling back to slow reference implementation" in text
    stats = sorted(p for p in (os.path.join(d, "stats.jsonl") for d in
                               [os.path.join(out, x) for x in os.listdir(out)] if os.path.isdir(d)) if os.path.isfile(p))
    if not stats:
        result["error"] = text.strip().splitlines()[-1:] or ["no output"]
        return result
    ticks = read_jsonl(stats[-1])
    steady = [t for t in ticks if t["Progress/tick"]["mean"] >= 2] or ticks[1:]
    per_kimg = [t["Timing/sec_per_kimg"]["mean"] for t in steady]
    result.update({
        "ticks": len(ticks),
        "sec_per_kimg_by_tick": [t["Timing/sec_per_kimg"]["mean"] for t in ticks],
        "sec_per_kimg": sum(per_kimg) / len(per_kimg) if per_kimg else None,
        "peak_gpu_mem_gb": max(t["Resources/peak_gpu_mem_gb"]["mean"] for t in ticks),
        "peak_gpu_mem_reserved_gb": max(t["Resources/peak_gpu_mem_reserved_gb"]["mean"] for t in ticks),
        "losses_finite": all(math.isfinite(t[k]["mean"]) for t in ticks for k in ("Loss/G/loss", "Loss/D/loss")
                             if k in t),
        "last_losses": {k: ticks[-1][k]["mean"] for k in ("Loss/G/loss", "Loss/D/loss", "Loss/G/reg", "Loss/D/reg")
                        if k in ticks[-1]},
    })
    shutil.rmtree(out, ignore_errors=True)  # its network pickles
    return result


# ganc's progress records: every LAZY_PERIOD steps, so each holds one R1 step (Dreg, every 16)
# and four path-length steps (Greg, every 4), the same mix as a kimg of training.
LAZY_PERIOD = 16


def ganc_warmup(extra: list) -> int:
    """The eager runs each phase takes before its capture: --warmup in `extra`, else ganc's 3."""
    return int(extra[extra.index("--warmup") + 1]) if "--warmup" in extra else 3


def run_ganc(ganc_bin: str, model: str, plan: str, data: str, out: str, batch: int, kimg: int, limit: float,
             extra: list, kernel_steps: int = 0, name: str = "ganc") -> dict:
    every = kernel_steps or LAZY_PERIOD
    # Warm-up: the first kimg, and at least until the rarest phase (R1, every 16 steps) has run
    # its eager warm-ups and its capture; then kimg - 1 measured, then the profiled steps.
    warm = max(math.ceil(1000 / batch), LAZY_PERIOD * (ganc_warmup(extra) + 1))
    warm = every * math.ceil(warm / every)
    measured = every * max(1, math.ceil((kimg - 1) * 1000 / batch / every))
    steps = warm + measured + kernel_steps
    run = os.path.join(out, f"{name}_b{batch}")
    cmd = [ganc_bin, "train", plan, "--model", model, "--data", data, "--device", "cuda", "--steps", str(steps),
           "--out", run, "--sample-every", "0", "--checkpoint-every", "0", "--log-every", str(every),
           "--tensorboard", "off"] + extra
    if kernel_steps:  # the last record's steps under the CUDA profiler: where the GPU's time goes
        cmd += ["--kernel-time", str(kernel_steps)]
    start = time.time()
    with MemorySampler() as memory, open(os.path.join(out, f"{name}_b{batch}.txt"), "w") as f:
        rc = run_until(cmd, limit, f)
    result = {"exit": rc, "wall_seconds": time.time() - start, "nvidia_smi_peak_gib": memory.peak_gib(),
              "command": " ".join(cmd)}
    path = os.path.join(run, "stats.jsonl")
    if not os.path.isfile(path):
        result["error"] = open(os.path.join(out, f"{name}_b{batch}.txt")).read().strip().splitlines()[-3:]
        return result
    records = read_jsonl(path)
    steady = [r for r in records if warm < r["step"] <= warm + measured] or records[1:]
    rates = [r["Progress/img_per_sec"] for r in steady if r.get("Progress/img_per_sec")]
    losses = [v for r in records for k, v in r.items() if k.startswith("Loss/")]
    values = [v["mean"] if isinstance(v, dict) else v for v in losses]
    result.update({
        "steps": steps, "warm_up_steps": warm, "measured_steps": measured, "records": len(records),
        "sec_per_kimg_by_record": [1000.0 / r["Progress/img_per_sec"] for r in records if r.get("Progress/img_per_sec")],
        "sec_per_kimg": 1000.0 / (sum(rates) / len(rates)) if rates else None,
        "losses_finite": bool(values) and all(math.isfinite(v) for v in values),
        "last_losses": {k: v for k, v in records[-1].items() if k.startswith("Loss/")},
    })
    summary = os.path.join(run, "summary.json")
    if os.path.isfile(summary):
        result["summary"] = json.load(open(summary))
    timing = os.path.join(run, "timing.json")
    if os.path.isfile(timing):
        timing = json.load(open(timing))
        result["phases"] = timing.get("phases")  # per phase: runs, median GPU and host seconds
        if kernel_steps:
            result["kernel_time"] = timing.get("kernel_time")
    return result


def print_phases(batch: int, phases) -> None:
    """One line: each phase's median GPU time per replay, and how often it ran."""
    if not phases:
        return
    parts = [f"{name} {p['work_seconds_median'] * 1000:.1f} ms x{p['runs']}" for name, p in phases.items()
             if p.get("work_seconds_median") is not None]
    print(f"batch {batch}: ganc's phases, median GPU time per replay: {', '.join(parts)}", flush=True)


def print_kernel_time(batch: int, kernel_time) -> None:
    """ganc's profiled steps in two lines: GPU busy against wall time, and the top kernels."""
    if not kernel_time:
        return
    wall, busy = kernel_time["wall_seconds"], kernel_time["busy_seconds"]
    print(f"batch {batch}: ganc's last {kernel_time['steps']} steps under the profiler: GPU busy {busy:.3f} of "
          f"{wall:.3f} s ({100 * busy / wall:.1f} %), {kernel_time['gpu_activities']} activities", flush=True)
    for k in kernel_time["top"][:8]:
        print(f"    {k['seconds'] * 1000:9.2f} ms  {k['calls']:6d}x  {k['name'][:110]}", flush=True)


def table_row(batch: int, row: dict) -> list:
    nv, gc = row.get("nvidia", {}), row.get("ganc", {})

    def num(value, fmt="{:.2f}"):
        return fmt.format(value) if isinstance(value, (int, float)) else "n/a"

    ref = row.get("nvidia_ref", {})
    return [batch, num(nv.get("sec_per_kimg")) if "error" not in nv else "fails: " + str(nv["error"]),
            num(ref.get("sec_per_kimg")) if "error" not in ref else "fails: " + str(ref["error"]),
            num(gc.get("sec_per_kimg")) if "error" not in gc else "fails: " + str(gc["error"]),
            num(row.get("ganc_speedup"), "{:.2f}x"), num(nv.get("peak_gpu_mem_gb"), "{:.1f}"),
            f"{num(nv.get('nvidia_smi_peak_gib'), '{:.1f}')} / {num(gc.get('nvidia_smi_peak_gib'), '{:.1f}')}"]


# StyleGAN3's published strong-scaling efficiency from 1 to 8 A100s (StyleGAN3-T, their README's
# table): the only 8-GPU figure NVIDIA gives for these networks, beside which a prediction reads.
PUBLISHED_8_GPU_EFFICIENCY = {"256": 0.85, "1024": 0.98}
PROFILED_STEPS = 6 * LAZY_PERIOD  # R1 warmed up, captured at 48 and replayed from 64


def predict_scaling(ganc_bin: str, model: str, plan: str, data: str, out: str, batch: int, gpus: str, limit: float,
                    extra: list, device: str = "cuda") -> dict:
    """`ganc simulate`'s prediction for `gpus` from a profiled run on this GPU (`--profile`: each
    phase's forward, backward and bucket ready times, R1 replayed too), 8 GPUs per host on
    NVLink and InfiniBand between hosts: step time and efficiency per GPU count, ganc's
    overlapped buckets and one flat all-reduce after backward (StyleGAN3's own)."""
    profile = os.path.join(out, f"ganc_b{batch}_profile.json")
    cmd = [ganc_bin, "train", plan, "--model", model, "--data", data, "--device", device, "--steps",
           str(PROFILED_STEPS), "--out", os.path.join(out, f"ganc_b{batch}_profiled"), "--sample-every", "0",
           "--checkpoint-every", "0", "--log-every", str(PROFILED_STEPS), "--tensorboard", "off", "--profile",
           profile, *extra]
    with open(os.path.join(out, f"ganc_b{batch}_profiled.txt"), "w") as f:
        rc = run_until(cmd, limit, f)
    if rc != 0 or not os.path.isfile(profile):
        return {"error": f"the profiled run ended with {rc}", "command": " ".join(cmd)}
    simulate = [ganc_bin, "simulate", plan, "--profile", profile, "--gpus", gpus, "--link", "ib", "--json"]
    done = subprocess.run(simulate, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:], "command": " ".join(simulate)}
    return {"command": " ".join(cmd) + " && " + " ".join(simulate), "profile": json.load(open(profile)),
            "predictions": json.loads(done.stdout)}


def print_scaling(batch: int, resolution: int, scaling: dict) -> None:
    if "error" in scaling:
        print(f"batch {batch}: scaling prediction failed: {scaling['error']}", flush=True)
        return
    published = PUBLISHED_8_GPU_EFFICIENCY.get(str(resolution))
    for r in scaling["predictions"]:
        print(f"batch {batch}: predicted on {r['ranks']} GPUs: {r['step_seconds'] * 1e3:.1f} ms a step, "
              f"{r['efficiency'] * 100:.1f} % efficient (one flat all-reduce after backward: "
              f"{r['flat_efficiency'] * 100:.1f} %)", flush=True)
    if published:
        print(f"batch {batch}: StyleGAN3's published 1-to-8-A100 efficiency at {resolution} pixels: "
              f"{published * 100:.0f} %", flush=True)


def run_batch(result: dict, args, batch: int, sides: list, repo: str, data: str, work: str, ganc_bin: str,
              model: str, plan: str) -> None:
    """Every side at one per-GPU batch, ganc first (its per-phase times say the most), their rows
    printed as each ends."""
    row = result["by_batch"][str(batch)]
    # ganc as planned (fused), and with --fusion off: the reference resampling and bias_act it
    # replays otherwise.
    for side, fusion in (("ganc", []), ("ganc_unfused", ["--fusion", "off"])):
        if side not in sides:
            continue
        row[side] = run_ganc(ganc_bin, model, plan, data, work, batch, args.kimg, args.limit,
                             ["--batch-size", str(batch)] + args.ganc_args.split() + fusion, args.kernel_time,
                             name=side)
        shown = {k: v for k, v in row[side].items()
                 if k not in ("summary", "sec_per_kimg_by_record", "kernel_time", "phases")}
        print(f"batch {batch}: {side} {json.dumps(shown)}", flush=True)
        print_phases(batch, row[side].get("phases"))
        print_kernel_time(batch, row[side].get("kernel_time"))
        if args.scaling and side == "ganc":
            row["ganc_scaling"] = predict_scaling(ganc_bin, model, plan, data, work, batch, args.scaling, args.limit,
                                                  ["--batch-size", str(batch)] + args.ganc_args.split())
            print_scaling(batch, args.resolution, row["ganc_scaling"])
    fused, unfused = row.get("ganc", {}).get("sec_per_kimg"), row.get("ganc_unfused", {}).get("sec_per_kimg")
    if fused and unfused:
        row["fusion_speedup"] = unfused / fused
        print(f"batch {batch}: ganc unfused {unfused:.2f} s/kimg, fused {fused:.2f} s/kimg: fusion "
              f"{unfused / fused:.2f}x", flush=True)
    for side in ("nvidia", "nvidia_ref"):
        if side not in sides:
            continue
        row[side] = run_nvidia(repo, data, work, batch, args.kimg, args.cbase, args.gamma, args.limit,
                               reference_ops=side == "nvidia_ref")
        shown = {k: v for k, v in row[side].items() if k != "sec_per_kimg_by_tick"}
        label = "NVIDIA train.py" + (" (reference bias_act and upfirdn2d)" if side == "nvidia_ref" else "")
        print(f"batch {batch}: {label} {json.dumps(shown)}", flush=True)
    a, b = row.get("nvidia", {}).get("sec_per_kimg"), row.get("ganc", {}).get("sec_per_kimg")
    if a and b:
        row["ganc_speedup"] = a / b
        print(f"batch {batch}: NVIDIA {a:.2f} s/kimg, ganc {b:.2f} s/kimg: ganc {a / b:.2f}x", flush=True)
    # Against the same operations run eagerly: what ganc's replay itself gains or loses.
    r = row.get("nvidia_ref", {}).get("sec_per_kimg")
    if r and b:
        row["ganc_speedup_over_reference_ops"] = r / b
        print(f"batch {batch}: NVIDIA with reference ops {r:.2f} s/kimg, ganc {b:.2f} s/kimg: ganc {r / b:.2f}x",
              flush=True)


def write_result(result: dict, batches: list, path: str) -> None:
    """The result file with its table, as far as the runs got."""
    result["benchmark"] = "nvidia_train_speed"
    result["title"] = ("StyleGAN2 at 256 pixels in its official configuration on one GPU: ganc against NVIDIA's "
                       "own train.py, seconds per kimg after the first kimg (ganc's also after every phase's "
                       "capture, its profiled steps left out)")
    result["table"] = {"columns": ["per-GPU batch", "NVIDIA train.py s/kimg",
                                   "train.py, reference bias_act and upfirdn2d, s/kimg", "ganc s/kimg", "ganc speed-up",
                                   "NVIDIA peak GB (allocated)", "GPU memory by nvidia-smi, GiB (NVIDIA / ganc)"],
                       "rows": [table_row(batch, result["by_batch"][str(batch)]) for batch in batches]}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".partial", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".partial", path)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a checkout of NVlabs/stylegan3")
    parser.add_argument("--batches", default="4,32", help="per-GPU batch sizes")
    parser.add_argument("--kimg", type=int, default=3, help="kimg each side trains per batch (the first is warm-up)")
    parser.add_argument("--resolution", type=int, default=256)
    parser.add_argument("--cbase", type=int, default=16384)
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--images", type=int, default=512, help="images in the generated data set")
    parser.add_argument("--sides", default="nvidia,ganc",
                        help="of nvidia, nvidia_ref (train.py with reference bias_act and upfirdn2d, the operations "
                        "ganc's archive holds), ganc (fused, the default) and ganc_unfused (--fusion off)")
    parser.add_argument("--limit", type=float, default=240, help="seconds each run may take")
    parser.add_argument("--ganc-args", default="", help="options for every ganc train run")
    parser.add_argument("--kernel-time", type=int, default=LAZY_PERIOD,
                        help="N more ganc steps, the last, run under the CUDA profiler: its busy time and top kernels "
                        "go into the result (those steps are left out of s/kimg; 16 holds one R1 step); 0: none")
    parser.add_argument("--work", default=None, help="folder for the data, archives and runs (default: a temporary one)")
    parser.add_argument("--export-batch", type=int, default=None,
                        help="the batch ganc's archive is exported at (default: the smallest of --batches)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="make the data set, export and compile, then stop (a GPU machine's idle minutes)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "nvidia_train_speed.json"))
    parser.add_argument("--scaling", default="",
                        help="GPU counts (1,2,4,8): after ganc's run at each batch, a profiled run of "
                             f"{PROFILED_STEPS} steps and ganc simulate's prediction for them, beside StyleGAN3's "
                             "published 8-GPU efficiency")
    parser.add_argument("--build", default=os.environ.get("GANC_BUILD_DIR", os.path.join(ROOT, "build")))
    return parser.parse_args()


def main():
    args = parse_args()
    repo = os.path.abspath(args.repo)
    if not os.path.isfile(os.path.join(repo, "training", "networks_stylegan2.py")):
        raise SystemExit(f"{repo}: no training/networks_stylegan2.py (a NVlabs/stylegan3 checkout is needed)")
    sys.path.insert(0, repo)
    ganc_bin = os.environ.get("GANC", os.path.join(args.build, "tools", "ganc"))
    batches = [int(b) for b in args.batches.split(",")]
    sides = args.sides.split(",")
    unknown = sorted(set(sides) - {"nvidia", "nvidia_ref", "ganc", "ganc_unfused"})
    if unknown:
        raise SystemExit(f"nvidia_train_speed: --sides: unknown {', '.join(unknown)} "
                         "(nvidia, nvidia_ref, ganc, ganc_unfused)")
    work = args.work or tempfile.mkdtemp(prefix="ganc_nvidia_")
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, f"data{args.resolution}.zip")
    if not os.path.isfile(data):
        partial = f"{data}.{os.getpid()}"
        make_dataset(partial, args.resolution, args.images)
        os.replace(partial, data)  # whole, for a process preparing beside this one
    result = {"machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "command": " ".join(sys.argv), "torch": torch.__version__,
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "resolution": args.resolution, "cbase": args.cbase, "gamma": args.gamma, "kimg": args.kimg,
              "by_batch": {}}
    # One archive for every batch, exported at the smallest: the traced networks take any batch
    # (the minibatch-std group, min(4, N), is traced as 4), `ganc train --batch-size` sets the
    # batch, and the export's probes at 256 pixels stay small (at batch 32 they need over 24 GB
    # of host memory). Only the EMA half-life follows the export's batch: the same work per step.
    export_batch = args.export_batch or min(batches)
    for batch in batches:
        result["by_batch"][str(batch)] = {"train_py_options": dry_run_options(repo, data, batch, args.cbase,
                                                                              args.gamma)}
    options = (result["by_batch"][str(export_batch)]["train_py_options"] if export_batch in batches
               else dry_run_options(repo, data, export_batch, args.cbase, args.gamma))
    # "_gpu": traced as their blocks run on a GPU (trace_as_on_gpu), unlike archives made before.
    model, plan = (os.path.join(work, f"official_b{export_batch}_gpu.{x}") for x in ("pt", "plan"))
    result["ganc_export_batch"] = export_batch
    result["ganc_traced_as_on_gpu"] = True
    if ("ganc" in sides or "ganc_unfused" in sides) and not os.path.isfile(plan):
        trace_as_on_gpu()
        torch.manual_seed(0)
        t0 = time.time()
        # joint=False: `ganc train --device cuda` replays the TorchScript phases; capturing each
        # phase's joint graph as well would only lengthen the export on the GPU machine.
        ganc.export(OfficialStyleGAN2(options, args.resolution), model + ".partial",
                    spec(options, args.resolution, export_batch), verbose=False, joint=False)
        os.replace(model + ".partial", model)
        subprocess.run([ganc_bin, "compile", model, "-o", plan + ".partial"], check=True, stdout=subprocess.DEVNULL)
        os.replace(plan + ".partial", plan)
        print(f"exported and compiled at batch {export_batch} in {time.time() - t0:.0f} s", flush=True)
    if args.prepare_only:
        print(f"nvidia_train_speed: prepared batch {args.batches} in {work}")
        return
    if not torch.cuda.is_available():
        print(f"nvidia_train_speed: no CUDA GPU: made the data set, read train.py's options, exported and compiled "
              f"at batch {args.batches} in {work}; nothing trained")
        sys.exit(3)
    try:
        for batch in batches:
            run_batch(result, args, batch, sides, repo, data, work, ganc_bin, model, plan)
            write_result(result, batches, args.json)  # after each batch: a deadline keeps what finished
    except KeyboardInterrupt:
        result["interrupted"] = "stopped by SIGINT (a deadline) before every batch and side ran"
        write_result(result, batches, args.json)
        print(f"nvidia_train_speed: interrupted; what finished is in {args.json}", flush=True)
        sys.exit(130)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
