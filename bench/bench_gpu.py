"""GPU benchmark: ganc's CUDA Graph replay against the ways people train GANs on GPUs.

For DCGAN-64 (batch 64, phases d and g) and the zoo's StyleGAN2 (batch 16, Gmain, Greg:
path length every 4 steps, Dmain, Dreg: R1 every 16 steps), on one GPU (NCCL, world size 1),
in one run, each side in its own process, on the same data, batch and optimizer (torch.optim's
fused Adam with the spec's hyper-parameters everywhere), cuDNN benchmark mode on everywhere:

- eager DDP, mmengine style: one DistributedDataParallel per submodule
  (find_unused_parameters=True), frozen submodules under no_sync(); the lazy regularisers,
  which DDP cannot run, on the unwrapped submodules with a flat all-reduce; once as people
  write it (NCHW) and once with the model and data in channels-last;
- StyleGAN3 style: no DDP, one flat NCCL all-reduce of every gradient after backward;
- a tuned eager loop, as a careful user writes it at world size 1: no DDP wrapper and no
  all-reduce, the model and data in channels-last, fused Adam, cuDNN benchmark;
- the same loop with each phase (forward, backward, optimizer step) captured by hand with
  `torch.cuda.graph` after three eager runs on a side stream, capturable fused Adam, the
  phase's inputs copied into static tensors before each replay (PyTorch's whole-network
  capture recipe);
- torch.compile(mode="reduce-overhead") and torch.compile(mode="max-autotune") of each phase
  method (flat all-reduce); where one fails (double backward), the row says so with the
  error; a side that runs past `--side-timeout` seconds (max-autotune's tuning) is stopped
  and says so;
- ganc eager: `ganc run --device cuda --cuda-graphs off` (the same plan, no graphs);
- ganc with one launch per step (`--cuda-graphs step`: a step's captured phases launched as
  one graph made of theirs);
- ganc replay in the NCHW layout (`--memory-format contiguous`), the layout the baselines use;
- ganc replay with the gradient all-reduces on NCCL's own stream (`--comm-stream side`, what
  several ranks use to overlap them with backward);
- ganc replay with the captured memset and copy nodes kept (`--memset-nodes keep --copy-nodes
  keep`; by default each becomes a kernel node, which the GPU starts with less idle around it);
- ganc replay with each data batch uploaded in order on the compute stream
  (`--upload-stream compute`; by default it goes on a copy stream of its own, beside the
  queued phases);
- ganc: `ganc run --device cuda`, every phase captured once and replayed, in its default
  layout on CUDA (channels-last for convolutional models), the all-reduces in order on the
  compute stream (`--comm-stream auto` at world size 1, where nothing overlaps).

Prints ms per step (a step runs every phase due at it), steps/s, ganc's speed-up over each
side, the GPU busy fraction (every side: how long the GPU ran kernels, copies or memsets,
overlaps counted once, over the wall time of 16 steps after the timed ones, under the CUDA
profiler: torch.profiler for the baselines, `ganc run --kernel-time 16` for ganc, the same
Kineto/CUPTI trace) and ganc's host time per replayed
phase, from a second ganc run that waits for the GPU after every step (`--log-every 1`): in
the timed run, where the GPU is the bottleneck, a graph launch also waits for launch-queue
space, which is not host work; that run is repeated for each ganc side measured (one launch
per step, the all-reduces on a side stream, the memset and copy nodes kept). `--json PATH` also writes
every number.

    python3 bench/bench_gpu.py [--iters 320] [--warmup 64] [--models dcgan64,stylegan2]
                               [--sides ganc,ganc_step,...] [--repeat N]

The Python baselines are host-bound and their speed varies between runs on one machine:
`--repeat 3` measures every side three times, alternating, and gives each row's median and
range.

`--models stylegan2_256` also takes StyleGAN2 at full size (49M parameters, 256 pixels).
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback

from results import GANC, ROOT  # noqa: E402  (first: python/ and models/ on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ganc  # noqa: E402
from ganc.reference import Inputs, make_optimizer, autocast, free_port, to_channels_last  # noqa: E402
import zoo  # noqa: E402

import baselines  # noqa: E402

# --sides: the rows, in the table's order.
SIDES = ["ddp", "ddp_cl", "flat", "tuned", "captured", "compile", "compile_max", "ganc_eager", "ganc_nchw", "ganc_side", "ganc_memsets", "ganc_upload",
         "ganc_step", "ganc"]
# model -> (data set, image size, phases eager DDP cannot run)
MODELS = {
    "dcgan64": ("digits", 64, ()),
    "stylegan2": ("digits", 32, ("Greg", "Dreg")),
    # Full size (StyleGAN2-ADA's 256-pixel configuration, batch 8): not in the default list.
    "stylegan2_256": ("digits", 256, ("Greg", "Dreg")),
}


# Steps each side runs under the CUDA profiler after its timed ones, for the GPU busy fraction.
TRACED = 16


GAP_EDGES = (2e-6, 10e-6, 100e-6)  # as ganc's kernel_time.idle_gaps


def _busy_and_gaps(prof):
    """How long the GPU ran anything (kernels, copies, memsets) in the profile, in seconds:
    the union of their intervals, so work overlapping on two streams (DDP's all-reduces during
    backward) counts once, as ganc's --kernel-time counts it; and the idle gaps between them
    (first start to last end) by length, as ganc's kernel_time.idle_gaps:
    [{shorter_than_seconds, count, seconds}]."""
    spans = sorted((evt.time_range.start / 1e6, evt.time_range.end / 1e6) for evt in prof.events()
                   if evt.device_type == torch.autograd.DeviceType.CUDA and evt.time_range.end > evt.time_range.start)
    buckets = [{"shorter_than_seconds": e, "count": 0, "seconds": 0.0} for e in GAP_EDGES + (None,)]
    busy, end = 0.0, None
    for a, b in spans:
        if end is not None and a > end:
            gap = a - end
            bucket = next(x for x in buckets if x["shorter_than_seconds"] is None or gap < x["shorter_than_seconds"])
            bucket["count"] += 1
            bucket["seconds"] += gap
        if end is None or b > end:
            busy += b - (a if end is None else max(a, end))
            end = b
    return busy, buckets


def _top_activities(prof, n=25):
    """The GPU activities by name, longest total first: [{name, calls, seconds}], as ganc's
    kernel_time.top."""
    by_name = {}
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            a = by_name.setdefault(evt.name, {"name": evt.name, "calls": 0, "seconds": 0.0})
            a["calls"] += 1
            a["seconds"] += evt.time_range.elapsed_us() / 1e6
    return sorted(by_name.values(), key=lambda a: -a["seconds"])[:n]


def fmt_top(side, top, gaps=None, steps=None, n=12):
    """A side's longest GPU activities per step, one line each, after its idle gaps."""
    steps = steps or TRACED
    lines = [f"  {side}: GPU time per step by kernel, longest first"]
    if gaps:
        bounds = ["< 2 us", "2-10 us", "10-100 us", ">= 100 us"]
        lines.insert(0, f"  {side}: GPU idle per step, gaps by length: " + ", ".join(
            f"{b} {g['count'] / steps:.1f}x {g['seconds'] / steps * 1e3:.3f} ms" for b, g in zip(bounds, gaps)))
    for a in top[:n]:
        lines.append(f"    {a['seconds'] / steps * 1e3:8.3f} ms  {a['calls'] / steps:6.1f}x  {a['name'][:110]}")
    return lines


class HandCaptured:
    """The tuned loop with each phase captured by hand, as PyTorch's CUDA Graphs recipe has a
    user do it: a phase's first three runs eager on a side stream (cuDNN's benchmark, the
    optimizer's state), then its forward, backward and capturable fused Adam step captured in
    one `torch.cuda.graph` from static input tensors (gradients set to None first, so the
    graph writes them rather than adds to them), then replayed after copying each step's
    inputs in. Plain phases only: accumulation, loss scalers and clipping are refused."""

    EAGER_RUNS = 3

    def __init__(self, gan, spec, subs, inputs, optimizers, methods):
        for phase in spec["phases"]:
            for s in phase["updates"]:
                if spec["optimizers"][s].get("clip_grad_norm"):
                    raise ValueError(f"hand capture: {s} is clipped")
            if phase.get("accumulate", 1) > 1 or phase.get("loss_scaler"):
                raise ValueError(f"hand capture: phase {phase['name']} accumulates or scales its loss")
        for opt in optimizers.values():
            for group in opt.param_groups:
                group["capturable"] = True
        self.gan, self.spec, self.subs, self.inputs = gan, spec, subs, inputs
        self.optimizers, self.methods = optimizers, methods
        self.params = {s: list(getattr(gan, s).parameters()) for s in subs}
        self.runs = {p["name"]: 0 for p in spec["phases"]}
        self.graphs = {}  # phase -> (graph, static inputs)
        self.side = torch.cuda.Stream()

    def _work(self, phase, args):
        updates = set(phase["updates"])
        for s in self.subs:
            for p in self.params[s]:
                p.requires_grad_(s in updates)
        with autocast("cuda", phase.get("precision", self.spec.get("precision", "float32"))):
            loss = self.methods[phase["name"]](*args)
        loss.backward()
        for s in phase["updates"]:
            self.optimizers[s].step()

    def _no_grads(self):
        for s in self.subs:
            for p in self.params[s]:
                p.grad = None

    def __call__(self, step):
        batch = None
        for phase in self.spec["phases"]:
            if step % phase.get("interval", 1):
                continue
            if batch is None and any(i["source"] in ("data", "labels") for i in phase["inputs"]):
                batch = self.inputs.batch()
            args = self.inputs.for_phase(phase, batch)
            name = phase["name"]
            self.runs[name] += 1
            if self.runs[name] <= self.EAGER_RUNS:
                self.side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.side):
                    self._no_grads()
                    self._work(phase, args)
                torch.cuda.current_stream().wait_stream(self.side)
                continue
            if name not in self.graphs:
                self._no_grads()
                static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self._work(phase, static)
                self.graphs[name] = (graph, static)
            graph, static = self.graphs[name]
            for dst, src in zip(static, args):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            graph.replay()


def _baseline(rank, port, model, style, data_path, iters, warmup, result_path, trace_path=None):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
        torch.backends.cudnn.benchmark = True
        torch._C._set_graph_executor_optimize(False)
        gan, spec = zoo.build(model)
        spec = ganc.validate(spec)
        gan = gan.cuda().train()
        # tuned and captured: the careful user's loop (no DDP at world size 1, channels-last).
        channels_last = style.endswith("_cl") or style in ("tuned", "captured")
        style = style.removesuffix("_cl")
        if channels_last:
            to_channels_last(gan)
        data = torch.load(data_path)
        data = (data["images"] if isinstance(data, dict) else data).float()
        inputs = Inputs(spec, data, 0, 1, seed=0, device="cuda")
        inputs.channels_last = channels_last
        subs = sorted({u for p in spec["phases"] for u in p["updates"]})
        opts = {s: make_optimizer(list(getattr(gan, s).parameters()), spec["optimizers"][s], cuda=True)
                for s in subs}
        if style == "ddp":
            for s in subs:
                setattr(gan, s, DDP(getattr(gan, s), device_ids=[0], find_unused_parameters=True,
                                    broadcast_buffers=False))
        methods = {p["name"]: getattr(gan, p["method"]) for p in spec["phases"]}
        if style in ("compile", "compile_max"):
            mode = "reduce-overhead" if style == "compile" else "max-autotune"
            methods = {k: torch.compile(m, mode=mode) for k, m in methods.items()}
        manual = MODELS[model][2] if style == "ddp" else ()
        captured = HandCaptured(gan, spec, subs, inputs, opts, methods) if style == "captured" else None
        step = 0

        def iteration():
            nonlocal step
            if captured:
                captured(step)
            else:
                baselines.iteration(gan, spec, subs, inputs, opts, "ddp" if style == "ddp" else "flat", 1,
                                    methods, step=step, manual=manual)
            step += 1

        for _ in range(warmup):
            iteration()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            iteration()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / iters
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                torch.profiler.ProfilerActivity.CPU]) as prof:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(TRACED):
                iteration()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        if trace_path:
            prof.export_chrome_trace(trace_path)
        busy, gaps = _busy_and_gaps(prof)
        result = {"seconds": seconds, "busy": busy / wall, "top": _top_activities(prof), "idle_gaps": gaps}
    except Exception as e:  # torch.compile cannot do double backward: report, do not hide
        lines = [line for line in str(e).splitlines() if line.strip()]
        result = {"error": f"{type(e).__name__}: {lines[0] if lines else ''}"[:300],
                  "trace": traceback.format_exc()[-2000:]}
    with open(result_path, "w") as f:
        json.dump(result, f)
    if dist.is_initialized():
        dist.destroy_process_group()


def baseline(model, style, data, iters, warmup, tmp, traces=None, timeout=None):
    """One baseline side in a process of its own; stopped after `timeout` seconds."""
    path = os.path.join(tmp, f"{model}_{style}.json")
    try:
        trace = os.path.join(traces, f"{model}_{style}.json") if traces else None
        context = mp.spawn(_baseline, args=(free_port(), model, style, data, iters, warmup, path, trace), nprocs=1,
                           join=False)
        deadline = time.monotonic() + timeout if timeout else None
        while not context.join(timeout=5):
            if deadline is not None and time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                return {"error": f"stopped after {timeout:.0f} s (--side-timeout), not done compiling or timing"}
    except Exception as e:
        return {"error": str(e).splitlines()[-1] if str(e) else type(e).__name__}
    return json.load(open(path))


def run_ganc(model, data, iters, warmup, tmp, graphs="on", layout="auto", log_every=None, traces=None,
             comm="auto", memsets="kernel", upload="copy"):
    """One `ganc run`. `log_every=1` makes the host wait for the GPU at the end of every step
    (it reads the losses), so no graph launch waits for launch-queue space: the run that
    measures the host's own time per replayed phase. `comm` is its --comm-stream, `memsets`
    its --memset-nodes and --copy-nodes, `upload` its --upload-stream."""
    gan, spec = zoo.build(model)
    archive, plan = os.path.join(tmp, model + ".pt"), os.path.join(tmp, model + ".plan")
    if not os.path.exists(plan):
        ganc.export(gan, archive, spec)
        subprocess.run([GANC, "compile", archive, "-o", plan], check=True)
    out = os.path.join(tmp, f"{model}_ganc_{graphs}_{layout}_{log_every}_{comm}_{memsets}_{upload}")
    # The timed steps, then TRACED more under the CUDA profiler (--kernel-time) for the busy
    # fraction, measured as the baselines' is. A progress line reads the losses, which waits
    # for the GPU: logging every gcd(warmup, warmup + iters) steps puts one at each end of the
    # timed steps, as the baselines synchronise before and after theirs.
    steps = warmup + iters + TRACED
    log_every = log_every or math.gcd(warmup, warmup + iters)
    # scripts/gpu_check.sh's fallback where the default failed its smoke run; the rows' own
    # options (given only where they differ from the default) win over it.
    fallback = os.environ.get("GANC_GPU_TRAIN_ARGS", "").split()
    r = subprocess.run([GANC, "run", "--nproc", "1", plan, "--model", archive, "--data", data, *fallback,
                        "--device", "cuda", "--steps", str(steps), "--out", out, "--sample-every", "0",
                        "--checkpoint-every", "0", "--log-every", str(log_every), "--warmup", "3",
                        "--force", "--tensorboard", "off", "--kernel-time", str(TRACED),
                        *(["--kernel-trace", os.path.join(traces, f"{model}_ganc_{graphs}_{layout}.json")]
                          if traces else []),
                        "--cuda-graphs", graphs, "--memory-format", layout, "--comm-stream", comm,
                        *(["--upload-stream", upload] if upload != "copy" else []),
                        *(["--memset-nodes", memsets, "--copy-nodes", memsets]
                          if graphs != "off" and memsets != "kernel" else [])],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    t = json.load(open(os.path.join(out, "timing.json")))
    steady = t["step_seconds"][warmup:warmup + iters]
    # Host times of the phases replayed in the timed steps (the traced ones come last).
    traced = sum(1 for step in range(warmup + iters, steps) for p in spec["phases"]
                 if step % p.get("interval", 1) == 0)
    replay = sorted(t["replay_host_seconds"][:max(0, len(t["replay_host_seconds"]) - traced)])
    launch = sorted(t["replay_launch_seconds"][:max(0, len(t["replay_launch_seconds"]) - traced)])
    kernels = t["kernel_time"] or {"error": "no kernel_time in timing.json"}
    if "error" in kernels:  # the row keeps its speed; the busy column says why it is missing
        print(f"[bench] {model}: --kernel-time failed: {kernels['error']}", flush=True)
    return {"seconds": sum(steady) / len(steady),
            "busy": None if "error" in kernels else kernels["busy_seconds"] / kernels["wall_seconds"],
            "top": kernels.get("top", []),
            "idle_gaps": kernels.get("idle_gaps"),
            "phase_busy": sum(t["work_seconds"][warmup:warmup + iters]) / sum(steady),
            "host_per_replay": replay[len(replay) // 2] if replay else None,
            "host_per_replay_mean": sum(replay) / len(replay) if replay else None,
            "host_per_replay_p90": replay[int(len(replay) * 0.9)] if replay else None,
            "launch_per_replay": launch[len(launch) // 2] if launch else None,
            "launch_per_replay_mean": sum(launch) / len(launch) if launch else None,
            "graph_nodes": t["graph_nodes"],
            "graph_branches": t["graph_branches"],
            "graph_memsets_as_kernels": t["graph_memsets_as_kernels"],
            "graph_copies_as_kernels": t["graph_copies_as_kernels"]}


def fmt_nodes(graph_nodes, graph_branches):
    """Each captured phase's graph nodes and branches: "d 212 (kernel 180, memset 20, ...;
    0 branches)"."""
    return "; ".join(f"{phase} {nodes['total']} (" +
                     ", ".join(f"{k} {n}" for k, n in sorted(nodes.items(), key=lambda kv: -kv[1])
                               if k != "total") + f"; {graph_branches.get(phase, '?')} branches)"
                     for phase, nodes in graph_nodes.items())


def combine(runs):
    """One row from a side's runs (one per round): the median step time and its range, the
    median GPU busy fraction; the first error if no run succeeded."""
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["seconds"])
    if not ok:
        return runs[0]
    row = dict(ok[len(ok) // 2])
    busy = sorted(r["busy"] for r in ok if r["busy"] is not None)
    row.update(runs=runs, min_seconds=ok[0]["seconds"], max_seconds=ok[-1]["seconds"],
               busy=busy[len(busy) // 2] if busy else None)
    return row


def fmt_row(name, r, ref):
    if "error" in r:
        return f"{name:34} {'fails: ' + r['error']}"
    speedup = f"{r['seconds'] / ref['seconds']:.2f}x" if ref and "seconds" in ref else "n/a"
    spread = ""
    if len(r.get("runs", ())) > 1:
        failed = sum("error" in run for run in r["runs"])
        spread = (f"  {r['min_seconds'] * 1e3:.3f}-{r['max_seconds'] * 1e3:.3f} ms over "
                  f"{len(r['runs']) - failed} runs" + (f" ({failed} failed)" if failed else ""))
    return (f"{name:34} {r['seconds'] * 1e3:9.3f} {1 / r['seconds']:9.1f} {speedup:>13} "
            f"{'n/a' if r['busy'] is None else format(r['busy'] * 100, '8.1f') + '%':>9}{spread}")


def table_lines(measured, runs, rows, g) -> list:
    """A model's rows (each side's runs combined into `rows`), where the GPU time goes for
    torch.compile and ganc, and ganc's graph nodes and host time per replay."""
    lines = []
    for _, name, _ in measured:
        rows[name] = combine(runs[name])
        lines.append(fmt_row(name, rows[name], g))
    # Where the GPU time goes, for the sides whose kernels differ most: torch.compile's
    # fused kernels against ganc's (eager DDP runs ganc's kernels, unfused, slower).
    for key, name, _ in measured:
        if key in ("compile", "ganc") and rows[name].get("top"):
            lines.extend(fmt_top(name, rows[name]["top"], rows[name].get("idle_gaps")))
    if g.get("graph_nodes"):
        lines.append("captured graphs' nodes (what each launch submits): "
                     f"{fmt_nodes(g['graph_nodes'], g['graph_branches'])}; made kernels: memset nodes "
                     f"{g.get('graph_memsets_as_kernels')}, copy nodes {g.get('graph_copies_as_kernels')}")
    if g.get("host_per_replay") is not None:
        lines.append(f"in the timed run above: {g['host_per_replay'] * 1e6:.1f} us median, "
                     f"{g['host_per_replay_p90'] * 1e6:.1f} us p90, of which the graph launch "
                     f"{g['launch_per_replay'] * 1e6:.1f} us (a launch also waits for queue space "
                     f"when the GPU is the bottleneck)")
    return lines


def host_timings(model, data, args, tmp, wanted, rows) -> None:
    """Host time from runs that wait for the GPU after every step (--log-every 1), so no
    launch waits for launch-queue space; per replayed phase, and with one launch per step that
    launch shared by the step's phases. One run for each ganc side measured."""
    for side, graphs, comm, memsets, what in (("ganc", "on", "auto", "kernel", "phase graphs"),
                                              ("ganc_step", "step", "auto", "kernel", "one launch per step"),
                                              ("ganc_side", "on", "side", "kernel",
                                               "collectives on a side stream"),
                                              ("ganc_memsets", "on", "auto", "keep",
                                               "memset and copy nodes kept")):
        if side not in wanted:
            continue
        host = rows[f"ganc host timing, {what} (--log-every 1)"] = run_ganc(
            model, data, args.iters, args.warmup, tmp, graphs, log_every=1, comm=comm, memsets=memsets)
        if host.get("host_per_replay") is not None:
            print(f"ganc host time per replayed phase, {what}: "
                  f"{host['host_per_replay_mean'] * 1e6:.1f} us mean, "
                  f"{host['host_per_replay'] * 1e6:.1f} us median, "
                  f"{host['host_per_replay_p90'] * 1e6:.1f} us p90; graph launches "
                  f"{host['launch_per_replay_mean'] * 1e6:.1f} us per phase "
                  f"(a run waiting for the GPU after every step)", flush=True)
        elif "error" in host:
            print(f"ganc host timing run ({what}) fails: {host['error']}", flush=True)
        if (comm == "side" or memsets == "keep") and host.get("graph_nodes"):
            print(f"  its graphs: {fmt_nodes(host['graph_nodes'], host['graph_branches'])}", flush=True)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=320, help="measured steps (a multiple of 16)")
    parser.add_argument("--warmup", type=int, default=64, help="steps before measuring (every phase "
                        "of StyleGAN2 is captured by step 48)")
    parser.add_argument("--models", default="dcgan64,stylegan2")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="which rows to measure (default: all): " + ", ".join(SIDES))
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds: each round measures every side once, in the table's order; "
                        "rows give the median ms/step (ratios between medians) and the range")
    parser.add_argument("--side-timeout", type=float, default=600,
                        help="seconds a baseline side may take, compiling included, before it is stopped")
    parser.add_argument("--once", default="",
                        help="sides measured in the first round only (e.g. compile_max, whose tuning "
                        "takes minutes)")
    parser.add_argument("--json", help="also write every number here")
    parser.add_argument("--traces", help="write the profiled steps of torch.compile and ganc replay here "
                        "as Chrome traces (MODEL_compile.json from torch.profiler, MODEL_ganc_on_auto.json "
                        "from ganc run --kernel-trace)")
    args = parser.parse_args()
    unknown = [w for w in args.sides.split(",") if w not in SIDES]
    if unknown:
        parser.error(f"--sides: unknown side {unknown[0]!r} (known: {', '.join(SIDES)})")
    once = [w for w in args.once.split(",") if w and w not in SIDES]
    if once:
        parser.error(f"--once: unknown side {once[0]!r}")
    if args.repeat < 1:
        parser.error("--repeat: at least 1")
    return args


def main():
    args = parse_args()
    wanted = args.sides.split(",")
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU")
    if args.traces:
        os.makedirs(args.traces, exist_ok=True)
    device = torch.cuda.get_device_name(0)
    results = {"device": device, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
               "iters": args.iters, "warmup": args.warmup, "models": {}}
    print(f"\n{device}, torch {torch.__version__}, NCCL world size 1, {results['date']}; "
          f"{args.iters} steps after {args.warmup} warm-up steps", flush=True)

    def write_json():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)

    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            dataset, size, _ = MODELS[model]
            data = os.path.join(tmp, f"{dataset}{size}.pt")
            if not os.path.exists(data):
                subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), dataset, "-o", data,
                                "--size", str(size)], check=True, stdout=subprocess.DEVNULL)
            g = run_ganc(model, data, args.iters, args.warmup, tmp, traces=args.traces)
            ms = f"{g['seconds'] * 1e3:.3f} ms/step" if "seconds" in g else "fails: " + g["error"]
            print(f"[bench] {model}, round 1/{args.repeat}: ganc (CUDA Graph replay): {ms}", flush=True)
            def base(style):
                traces = args.traces if style == "compile" else None
                return lambda: baseline(model, style, data, args.iters, args.warmup, tmp, traces,
                                        args.side_timeout)

            def own(graphs="on", layout="auto", comm="auto", memsets="kernel", upload="copy"):
                default = (graphs, layout, comm, memsets, upload) == ("on", "auto", "auto", "kernel", "copy")
                traces = args.traces if default else None
                return lambda: run_ganc(model, data, args.iters, args.warmup, tmp, graphs, layout,
                                        traces=traces, comm=comm, memsets=memsets, upload=upload)

            sides = [("ddp", "eager DDP (per submodule)", base("ddp")),
                     ("ddp_cl", "eager DDP, channels-last", base("ddp_cl")),
                     ("flat", "StyleGAN3-style flat all-reduce", base("flat")),
                     ("tuned", "tuned eager (no DDP, channels-last)", base("tuned")),
                     ("captured", "tuned eager, phases captured by hand", base("captured")),
                     ("compile", "torch.compile reduce-overhead", base("compile")),
                     ("compile_max", "torch.compile max-autotune", base("compile_max")),
                     ("ganc_eager", "ganc eager (--cuda-graphs off)", own("off")),
                     ("ganc_nchw", "ganc replay, NCHW layout", own(layout="contiguous")),
                     ("ganc_side", "ganc replay, collectives on a side stream", own(comm="side")),
                     ("ganc_memsets", "ganc replay, memset and copy nodes kept", own(memsets="keep")),
                     ("ganc_upload", "ganc replay, batch uploaded on the compute stream", own(upload="compute")),
                     ("ganc_step", "ganc, one launch per step", own("step")),
                     ("ganc", "ganc (CUDA Graph replay)", own())]
            rows = results["models"][model] = {}
            # Each model's table is printed (and the JSON written) as soon as it is measured,
            # so a run stopped by a time limit keeps every finished model.
            lines = [f"\n{model}, batch {zoo.build(model)[1]['batch_size']}"]
            lines.append(f"{'method':34} {'ms/step':>9} {'steps/s':>9} {'ganc speed-up':>13} {'GPU busy':>9}")
            measured = [(key, name, measure) for key, name, measure in sides if key in wanted]
            runs = {name: [] for _, name, _ in measured}
            for round_ in range(args.repeat):
                for key, name, measure in measured:
                    # Round 0's ganc row is the run measured above (and printed there).
                    if key == "ganc" and round_ == 0:
                        runs[name].append(g)
                        continue
                    if round_ > 0 and key in args.once.split(","):
                        continue
                    runs[name].append(measure())
                    r = runs[name][-1]
                    ms = f"{r['seconds'] * 1e3:.3f} ms/step" if "seconds" in r else "fails: " + r["error"]
                    print(f"[bench] {model}, round {round_ + 1}/{args.repeat}: {name}: {ms}",
                          flush=True)  # progress survives a time limit
            if "ganc" in wanted:
                g = combine(runs["ganc (CUDA Graph replay)"])
            lines.extend(table_lines(measured, runs, rows, g))
            print("\n".join(lines), flush=True)
            write_json()
            host_timings(model, data, args, tmp, wanted, rows)
            write_json()


if __name__ == "__main__":
    main()
