"""Where StyleGAN2's resampling spends its time on a GPU, by formulation: every `upfirdn2d` call
NVIDIA's G and D make in one forward at 256 pixels (shapes, dtypes and layouts recorded as
train.py runs them: float16 and channels-last in the top 4 resolutions), forward and backward
with respect to the image, timed as

- ref: their reference path (zero insertion, pad, a depthwise convolution with the FIR filter,
  slicing), what ganc's export traces and replays;
- plugin: their fused CUDA kernel (built as train.py builds it; skipped where it does not);
- strided: the same filter as one depthwise convolution whose stride does the downsampling, or
  one transposed depthwise convolution whose stride does the upsampling (no zeros inserted,
  no pixels computed and thrown away); the plain filter as ref;
- separable: a filter that is an outer product as two 1-D depthwise convolutions (8 taps a
  pixel where ref takes 16), after ref's padding; up or down as ref;
- nchw: ref on contiguous (NCHW) images, the layout PyTorch's own depthwise kernels take;
- folded: the channels folded into the batch (N*C images of one channel) and one single-
  channel convolution, where neither up nor down;
- ganc: ganc::upfirdn2d, the op the compiler's fusion puts in place of ref (ganc's ops
  library: GANC_OPS, else BUILD/ops/libganc_ops.so with BUILD from GANC_BUILD_DIR or ./build).

Each formulation's output and image gradient are compared with ref's. After the first GPU
profile of ganc against train.py (2026-11-27: at batch 32, cuDNN's grouped direct kernel, 4,378
copies and PyTorch's depthwise kernels were at least half of ganc's GPU time, where train.py
runs its fused kernel), this says what a rewrite of the traced resampling could gain before one
is written.

    python bench/resample_probe.py --repo external/stylegan3 [--batches 32,4]

Without a GPU it checks the formulations against ref in float64 and stops with one line (exit
3). Results: bench/results/resample_probe.json (machine, date, command, every number).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import results  # bench/results.py
from results import HERE



def _pair(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v, v]


def _padding(p) -> list:
    """[x0, x1, y0, y1], as upfirdn2d parses it."""
    if isinstance(p, int):
        return [p, p, p, p]
    p = list(p)
    return [p[0], p[0], p[1], p[1]] if len(p) == 2 else p


def _filter2d(f: torch.Tensor, gain: float, flip: bool, dtype) -> torch.Tensor:
    """The 2-D correlation kernel ref applies: the filter (1-D: its outer product), scaled by the
    gain, flipped unless flip_filter."""
    if f.ndim == 1:
        f = torch.outer(f, f)
    f = f * gain
    return (f if flip else f.flip([0, 1])).to(dtype)


def ref(x, f, up=1, down=1, padding=0, flip_filter=False, gain=1):
    """Their reference upfirdn2d (its steps, written out as theirs are)."""
    n, c, h, w = x.shape
    (upx, upy), (downx, downy) = _pair(up), _pair(down)
    px0, px1, py0, py1 = _padding(padding)
    x = x.reshape([n, c, h, 1, w, 1])
    x = F.pad(x, [0, upx - 1, 0, 0, 0, upy - 1])
    x = x.reshape([n, c, h * upy, w * upx])
    x = F.pad(x, [max(px0, 0), max(px1, 0), max(py0, 0), max(py1, 0)])
    x = x[:, :, max(-py0, 0): x.shape[2] - max(-py1, 0), max(-px0, 0): x.shape[3] - max(-px1, 0)]
    k = _filter2d(f, gain, flip_filter, x.dtype)
    x = F.conv2d(x, k[None, None].repeat([c, 1, 1, 1]), groups=c)
    return x[:, :, ::downy, ::downx]


def _pad_crop(x, px0, px1, py0, py1):
    x = F.pad(x, [max(px0, 0), max(px1, 0), max(py0, 0), max(py1, 0)])
    return x[:, :, max(-py0, 0): x.shape[2] - max(-py1, 0), max(-px0, 0): x.shape[3] - max(-px1, 0)]


def strided(x, f, up=1, down=1, padding=0, flip_filter=False, gain=1):
    """Downsampling as the stride of the filter's convolution; upsampling as the stride of a
    transposed one (the zero-inserted image never made). None where not expressible."""
    c = x.shape[1]
    (upx, upy), (downx, downy) = _pair(up), _pair(down)
    px0, px1, py0, py1 = _padding(padding)
    if upx == upy == 1:
        k = _filter2d(f, gain, flip_filter, x.dtype)
        return F.conv2d(_pad_crop(x, px0, px1, py0, py1), k[None, None].repeat([c, 1, 1, 1]), stride=[downy, downx],
                        groups=c)
    if downx != 1 or downy != 1:
        return None
    # out[o] = sum_i x[i] g[u i + p0 - o] with g the correlation kernel: a transposed convolution
    # with weight flip(g), padding K - 1 - p0 and output padding u + p1 - p0 - 1.
    k = _filter2d(f, gain, flip_filter, x.dtype).flip([0, 1])
    kh, kw = k.shape
    pad = [kh - 1 - py0, kw - 1 - px0]
    out_pad = [upy + py1 - py0 - 1, upx + px1 - px0 - 1]
    if min(pad) < 0 or min(out_pad) < 0 or out_pad[0] >= upy or out_pad[1] >= upx:
        return None
    return F.conv_transpose2d(x, k[None, None].repeat([c, 1, 1, 1]), stride=[upy, upx], padding=pad,
                              output_padding=out_pad, groups=c)


def separable(x, f, up=1, down=1, padding=0, flip_filter=False, gain=1):
    """A rank-1 filter as a vertical and a horizontal 1-D depthwise convolution, after ref's zero
    insertion and padding. None for a filter that is not an outer product."""
    k = _filter2d(f, gain, flip_filter, torch.float64)
    u, s, v = torch.linalg.svd(k)
    col, row = u[:, 0] * s[0].sqrt(), v[0] * s[0].sqrt()
    if (torch.outer(col, row) - k).abs().max() > 1e-6 * k.abs().max():
        return None
    n, c, h, w = x.shape
    (upx, upy), (downx, downy) = _pair(up), _pair(down)
    px0, px1, py0, py1 = _padding(padding)
    if upx != 1 or upy != 1:
        x = F.pad(x.reshape([n, c, h, 1, w, 1]), [0, upx - 1, 0, 0, 0, upy - 1]).reshape([n, c, h * upy, w * upx])
    x = _pad_crop(x, px0, px1, py0, py1)
    x = F.conv2d(x, col.to(x.dtype)[None, None, :, None].repeat([c, 1, 1, 1]), stride=[downy, 1], groups=c)
    return F.conv2d(x, row.to(x.dtype)[None, None, None, :].repeat([c, 1, 1, 1]), stride=[1, downx], groups=c)


def nchw(x, f, up=1, down=1, padding=0, flip_filter=False, gain=1):
    return ref(x.contiguous(), f, up, down, padding, flip_filter, gain)


def folded(x, f, up=1, down=1, padding=0, flip_filter=False, gain=1):
    """Neither up nor down: the N*C channel images as a batch of one-channel images, one
    single-channel convolution. None otherwise."""
    if _pair(up) != [1, 1] or _pair(down) != [1, 1]:
        return None
    n, c, h, w = x.shape
    px0, px1, py0, py1 = _padding(padding)
    k = _filter2d(f, gain, flip_filter, x.dtype)
    y = F.conv2d(_pad_crop(x.contiguous().view(n * c, 1, h, w), px0, px1, py0, py1), k[None, None])
    return y.view(n, c, y.shape[2], y.shape[3])


def ganc_op(x, f, up=1, down=1, padding=0, flip_filter=False, gain=1):
    """ganc::upfirdn2d (loaded by load_ganc_ops)."""
    return torch.ops.ganc.upfirdn2d(x, f, _pair(up), _pair(down), _padding(padding), bool(flip_filter),
                                    float(gain), "aten::conv2d")


def load_ganc_ops() -> bool:
    """ganc's ops library into torch.ops.ganc; False where it is not built."""
    if hasattr(torch.ops.ganc, "upfirdn2d"):
        return True
    build = os.environ.get("GANC_BUILD_DIR", os.path.join(HERE, "..", "build"))
    path = os.environ.get("GANC_OPS", os.path.join(build, "ops", "libganc_ops.so"))
    if not os.path.isfile(path):
        return False
    torch.ops.load_library(path)
    return True


CANDIDATES = {"strided": strided, "separable": separable, "nchw": nchw, "folded": folded}
if load_ganc_ops():
    CANDIDATES["ganc"] = ganc_op


def float64_check(theirs=None) -> float:
    """Every candidate against ref in float64, on StyleGAN2's resampling calls (upsample2d,
    downsample2d, the filter around a strided or transposed convolution) and odd ones (1-D and
    flipped filters, crops, gains, unequal factors): the largest relative difference of the
    outputs and image gradients, over the candidates that express the call; with `theirs`
    (their _upfirdn2d_ref), ref against it too, for the 2-D filters."""
    torch.manual_seed(0)
    f4 = torch.tensor([1.0, 3.0, 3.0, 1.0])
    f4 = torch.outer(f4, f4) / torch.outer(f4, f4).sum()
    calls = [dict(up=2, padding=[2, 1, 2, 1], gain=4), dict(down=2, padding=[1, 1, 1, 1]),
             dict(padding=[2, 2, 2, 2], gain=4), dict(padding=[1, 1, 1, 1]), dict(up=2, padding=[1, 2, 1, 2], gain=4),
             dict(down=2, padding=[0, 1, 2, -1], flip_filter=True), dict(up=[2, 1], padding=[2, 1, 1, 1], gain=2)]
    worst = 0.0
    for call in calls:
        for f in (f4, torch.tensor([1.0, 2.0, 1.0]) / 4, torch.rand(3, 4)):
            x = torch.randn(2, 3, 7, 6, dtype=torch.float64, requires_grad=True)
            want = ref(x, f, **call)
            gy = torch.randn_like(want)
            (want_gx,) = torch.autograd.grad(want, x, gy)
            # Theirs runs a 1-D filter as two passes, each with the square root of the gain, in float32.
            candidates = dict(CANDIDATES, theirs=theirs) if theirs and f.ndim == 2 else CANDIDATES
            for name, candidate in candidates.items():
                got = candidate(x, f, **call)
                if got is None:
                    continue
                assert got.shape == want.shape, (name, call, got.shape, want.shape)
                (gx,) = torch.autograd.grad(got, x, gy)
                worst = max(worst, ((got - want).abs().max() / want.abs().max()).item(),
                            ((gx - want_gx).abs().max() / want_gx.abs().max()).item())
    return worst


def record_calls(model, real, z) -> list:
    """The upfirdn2d calls of one G and one D forward: (x's shape, dtype and layout, f, kwargs)."""
    from torch_utils.ops import upfirdn2d as module
    calls, original = [], module.upfirdn2d

    def recording(x, f, up=1, down=1, padding=0, flip_filter=False, gain=1, impl="cuda"):
        calls.append((tuple(x.shape), x.dtype, x.is_contiguous(memory_format=torch.channels_last) and not
                      x.is_contiguous(), f.detach().clone(), dict(up=up, down=down, padding=padding,
                                                                 flip_filter=flip_filter, gain=gain)))
        return original(x, f, up=up, down=down, padding=padding, flip_filter=flip_filter, gain=gain, impl=impl)

    module.upfirdn2d = recording
    try:
        with torch.no_grad():
            img = model.G(z, None)
            model.D(img, None)
            model.D(real, None)
    finally:
        module.upfirdn2d = original
    return calls


def time_call(run, x, f, kwargs, iters: int) -> float:
    """Median seconds of a forward and a backward with respect to the image (GPU time between
    two events on CUDA, else wall time)."""
    xs = x.detach().requires_grad_(True)
    gy = None
    times = []
    for i in range(2 + iters):
        if xs.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            began = time.perf_counter()
        y = run(xs, f, **kwargs)
        if gy is None:
            gy = torch.randn_like(y)
        torch.autograd.grad(y, xs, gy)
        if xs.is_cuda:
            end.record()
            torch.cuda.synchronize()
            spent = start.elapsed_time(end) / 1000
        else:
            spent = time.perf_counter() - began
        if i >= 2:
            times.append(spent)
    return statistics.median(times)


FORMULATIONS = ["ref", "plugin", "ganc", "strided", "separable", "nchw", "folded"]


def with_table(result: dict) -> dict:
    """The result with its table: per batch, each formulation's summed milliseconds and its
    speed against ref (what docs/benchmarks.md shows)."""
    rows = []
    for batch, row in result["by_batch"].items():
        seconds = row["seconds"]
        rows.append([batch] + [f"{seconds[n] * 1000:.1f} ({seconds['ref'] / seconds[n]:.2f}x)" if n in seconds
                               else "n/a" for n in FORMULATIONS])
    result["table"] = {"columns": ["per-GPU batch"] + [f"{n}, ms (speed vs ref)" for n in FORMULATIONS],
                       "rows": rows}
    return result


def time_calls(calls, formulations, ref, device, iters):
    """Each kind of recorded call once, by every formulation (checked against `ref`), its
    seconds counted as many times as the call was made: (row, seconds per formulation, the
    calls by kind)."""
    unique = collections.Counter((shape, dtype, cl, tuple(f.shape), json.dumps(kw))
                                 for shape, dtype, cl, f, kw in calls)
    row = {"calls": len(calls), "unique_calls": len(unique), "seconds": {}, "max_difference": {}, "by_call": []}
    totals = collections.defaultdict(float)
    seen = set()
    for shape, dtype, cl, f, kw in calls:
        key = (shape, dtype, cl, tuple(f.shape), json.dumps(kw))
        if key in seen:
            continue
        seen.add(key)
        count = unique[key]
        x = torch.randn(shape, dtype=dtype, device=device)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        f = f.to(device)
        want = ref(x, f, **kw).float()
        entry = {"shape": list(shape), "dtype": str(dtype), "channels_last": cl, "filter": list(f.shape), **kw,
                 "count": count, "seconds": {}}
        for name, run in formulations.items():
            got = run(x, f, **kw)
            if got is None:
                continue
            diff = ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
            row["max_difference"][name] = max(row["max_difference"].get(name, 0.0), diff)
            entry["seconds"][name] = time_call(run, x, f, kw, iters)
        for name in formulations:  # a call a formulation cannot express costs what ref costs
            totals[name] += count * entry["seconds"].get(name, entry["seconds"]["ref"])
        row["by_call"].append(entry)
    return row, totals, unique


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a checkout of NVlabs/stylegan3")
    parser.add_argument("--batches", default="32,4")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--resolution", type=int, default=256)
    parser.add_argument("--cbase", type=int, default=16384)
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs the same steps there (a smoke run)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "resample_probe.json"))
    return parser.parse_args()


def main():
    args = parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print(f"resample_probe: float64, every formulation against ref: {float64_check():.1e} relative")
        print("resample_probe: no CUDA GPU: checked the formulations in float64, timed nothing")
        sys.exit(3)
    sys.path.insert(0, HERE)
    import nvidia_train_speed as official
    repo = os.path.abspath(args.repo)
    sys.path.insert(0, repo)
    import nvidia_compat  # noqa: F401  (their code's shims for PyTorch 2.11, the plugins' import among them)
    from torch_utils.ops import upfirdn2d as module
    difference = float64_check(theirs=module._upfirdn2d_ref)
    print(f"resample_probe: float64, every formulation against ref, and ref against theirs: {difference:.1e} "
          "relative", flush=True)
    if difference > 1e-10:
        raise SystemExit(f"resample_probe: a formulation disagrees with ref ({difference:.1e}); nothing timed")
    plugin = cuda and module._init()
    formulations = dict(ref=module._upfirdn2d_ref, **CANDIDATES)
    if plugin:
        formulations["plugin"] = lambda x, f, **kw: module.upfirdn2d(x, f, impl="cuda", **kw)
    torch.backends.cudnn.benchmark = True
    where = torch.cuda.get_device_name(0) if cuda else f"CPU, {os.cpu_count()} cores"
    result = {"benchmark": "resample_probe", "machine": f"{where}, {platform.node()}",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "command": " ".join(sys.argv), "torch": torch.__version__, "plugin_built": bool(plugin),
              # ganc's CUDA kernel for the op: the tiled one by default, "direct" its earlier mix
              "upfirdn2d_kernel": os.environ.get("GANC_UPFIRDN2D_KERNEL", "tiled"),
              "float64_difference": difference, "resolution": args.resolution, "cbase": args.cbase,
              "title": (f"StyleGAN2's upfirdn2d calls of one G and one D forward at {args.resolution} pixels (channel base "
                        f"{args.cbase}) on {where}, forward and image gradient, seconds summed over "
                        "the calls by formulation (median of the timed runs of each)"),
              "by_batch": {}, "complete": False}
    data = os.path.join(tempfile.mkdtemp(prefix="ganc_resample_"), "data.zip")
    official.make_dataset(data, args.resolution, 32)
    for batch in (int(b) for b in args.batches.split(",")):
        options = official.dry_run_options(repo, data, batch, args.cbase, 1.0)
        torch.manual_seed(0)
        model = official.OfficialStyleGAN2(options, args.resolution).to(args.device)
        real = torch.randn(batch, 3, args.resolution, args.resolution, device=args.device)
        z = torch.randn(batch, options["G_kwargs"]["z_dim"], device=args.device)
        calls = record_calls(model, real, z)
        del model
        if cuda:
            torch.cuda.empty_cache()
        row, totals, unique = time_calls(calls, formulations, module._upfirdn2d_ref, args.device, args.iters)
        row["seconds"] = dict(totals)
        result["by_batch"][str(batch)] = row
        line = ", ".join(f"{name} {seconds * 1000:.1f} ms ({totals['ref'] / seconds:.2f}x)"
                         for name, seconds in sorted(totals.items(), key=lambda kv: kv[1]))
        print(f"batch {batch}: {len(calls)} upfirdn2d calls ({len(unique)} kinds), forward + image gradient, "
              f"summed: {line}", flush=True)
        print(f"batch {batch}: largest difference from ref: "
              + ", ".join(f"{k} {v:.1e}" for k, v in row["max_difference"].items()), flush=True)
        results.save(with_table(result), args.json)
    result["complete"] = True
    results.save(with_table(result), args.json)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
