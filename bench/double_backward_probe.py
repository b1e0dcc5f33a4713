"""Where StyleGAN2's regularisation steps spend their time on a GPU: R1 (Dreg) and path length
(Greg) of NVIDIA's own networks at 256 pixels, run eagerly, each convolution's double backward
as PyTorch derives it ("native") against a weight-gradient formulation ("wgrad").

PyTorch's double backward of a convolution computes the second-order weight gradient as a
convolution of the input with the output gradient over the batch: batch and channels swap, and
the "kernel" is the whole output image (256 x 256 at D's first layers), with N (the batch) as
its channel count. cuDNN has no fast kernel for that shape. "wgrad" is the formulation of
NVIDIA's conv2d_gradfix (which turns itself off on PyTorch >= 1.11): the first backward's
weight gradient is `convolution_backward`'s (cuDNN's weight-gradient kernels), its own
backward a forward and a transposed convolution. Both are exact: on the CPU in float64 they
agree to rounding (checked first, always).

On a GPU: NVIDIA's D and G in train.py's --cfg=stylegan2 configuration (float16 and
channels-last in the top 4 resolutions), their bias_act and upfirdn2d on their reference paths
(as ganc's export traces them) unless --plugins; per batch, the median of --iters timed R1 and
path-length steps for each formulation after two warm-ups, cuDNN benchmark on, the gradients of
the two compared, and the top kernels of one native R1 step from torch.profiler.

    python bench/double_backward_probe.py --repo external/stylegan3 [--batches 4,32]

Without a GPU it runs the float64 check and stops with one line (exit 3). Results:
bench/results/double_backward_probe.json (machine, date, command, every number).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
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

_conv2d, _conv_transpose2d = F.conv2d, F.conv_transpose2d


def _pair(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v, v]


class _Conv(torch.autograd.Function):
    """A convolution (or transposed one) whose backward is written with `convolution_backward`'s
    weight gradient, differentiable again through `_GradWeight`."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups, transposed, output_padding):
        ctx.save_for_backward(x, w)
        ctx.conf = (stride, padding, dilation, groups, transposed, output_padding)
        if transposed:
            return _conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation)
        return _conv2d(x, w, b, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _input_grad(gy, w, x.shape, ctx.conf)
        if ctx.needs_input_grad[1]:
            gw = _GradWeight.apply(gy, x, w.shape, ctx.conf)
        if ctx.needs_input_grad[2]:
            gb = gy.sum((0, 2, 3))
        return gx, gw, gb, None, None, None, None, None, None


def _input_grad(gy, w, x_shape, conf):
    """The gradient with respect to the input: the opposite convolution of gy with w."""
    stride, padding, dilation, groups, transposed, _ = conf
    if transposed:
        return _Conv.apply(gy, w, None, stride, padding, dilation, groups, False, [0, 0])
    k = w.shape[2:]
    op = [x_shape[i + 2] - ((gy.shape[i + 2] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k[i] - 1) + 1)
          for i in range(2)]
    return _Conv.apply(gy, w, None, stride, padding, dilation, groups, True, op)


class _GradWeight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gy, x, w_shape, conf):
        ctx.save_for_backward(gy, x)
        ctx.conf = conf
        stride, padding, dilation, groups, transposed, output_padding = conf
        w = torch.empty(w_shape, dtype=x.dtype, device=x.device)
        return torch.ops.aten.convolution_backward(gy, x, w, None, stride, padding, dilation, transposed,
                                                   output_padding, groups, [False, True, False])[1]

    @staticmethod
    def backward(ctx, ggw):
        gy, x = ctx.saved_tensors
        stride, padding, dilation, groups, transposed, output_padding = ctx.conf
        g_gy = g_x = None
        if ctx.needs_input_grad[0]:
            g_gy = _Conv.apply(x, ggw, None, stride, padding, dilation, groups, transposed, output_padding)
        if ctx.needs_input_grad[1]:
            g_x = _input_grad(gy, ggw, x.shape, ctx.conf)
        return g_gy, g_x, None, None


def _wgrad_conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str) or (_GROUPED_ONLY and groups == 1):
        return _conv2d(input, weight, bias, stride, padding, dilation, groups)
    return _Conv.apply(input, weight, bias, _pair(stride), _pair(padding), _pair(dilation), groups, False, [0, 0])


def _wgrad_conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    if _GROUPED_ONLY and groups == 1:
        return _conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)
    return _Conv.apply(input, weight, bias, _pair(stride), _pair(padding), _pair(dilation), groups, True,
                       _pair(output_padding))


_GROUPED_ONLY = False
FORMULATIONS = ("native", "wgrad", "grouped")


@contextlib.contextmanager
def formulation(name: str):
    """Every F.conv2d / F.conv_transpose2d call inside, as `name` differentiates it: "grouped" is
    wgrad for the grouped convolutions only (groups > 1), PyTorch's for the rest."""
    global _GROUPED_ONLY
    if name in ("wgrad", "grouped"):
        F.conv2d, F.conv_transpose2d = _wgrad_conv2d, _wgrad_conv_transpose2d
        _GROUPED_ONLY = name == "grouped"
    try:
        yield
    finally:
        F.conv2d, F.conv_transpose2d = _conv2d, _conv_transpose2d
        _GROUPED_ONLY = False


def float64_check() -> float:
    """R1 through strided, depthwise, 1x1 and transposed convolutions in float64, plus a penalty
    on one weight's gradient: the two formulations' parameter gradients, largest relative
    difference."""
    torch.manual_seed(0)
    ws = [torch.randn(8, 3, 3, 3), torch.randn(8, 1, 4, 4), torch.randn(16, 8, 3, 3), torch.randn(16, 8, 1, 1),
          torch.randn(16, 4, 4, 4)]
    ws = [(w * 0.3).double().requires_grad_(True) for w in ws]
    x0 = torch.randn(2, 3, 12, 12, dtype=torch.float64)

    def r1():
        x = x0.clone().requires_grad_(True)
        h = F.leaky_relu(F.conv2d(x, ws[0], padding=1), 0.2)
        h = F.conv2d(F.pad(h, [1, 2, 1, 2]), ws[1], groups=8)  # upfirdn2d's FIR filter
        skip = F.conv2d(h[:, :, ::2, ::2], ws[3])
        h = F.leaky_relu(F.conv2d(h, ws[2], stride=2, padding=1), 0.2) + skip
        h = F.conv_transpose2d(h, ws[4], stride=2, padding=1, groups=4)
        # R1's gradient at the input, and (to reach the weight gradient's own backward) one at a
        # weight too.
        g, gw = torch.autograd.grad(h.square().sum(), [x, ws[2]], create_graph=True)
        return torch.autograd.grad(g.square().sum() + gw.square().sum(), ws)

    grads = {}
    for name in FORMULATIONS:
        with formulation(name):
            grads[name] = r1()
    return max(((a - b).abs().max() / a.abs().max()).item()
               for name in FORMULATIONS[1:] for a, b in zip(grads["native"], grads[name]))


def timed(step, cuda: bool) -> float:
    """Seconds `step` takes: GPU time between two events on CUDA, else wall time."""
    if not cuda:
        start = time.perf_counter()
        step()
        return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000


def profile_dreg(model, real, row, batch, cuda) -> None:
    """The top kernels of one R1 step, natively and with wgrad for the grouped convolutions."""
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    spent = (lambda e: e.device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    for name in ("native", "grouped"):
        with formulation(name), torch.profiler.profile(activities=[activity]) as prof:
            model.phase_dreg(real).backward()
            if cuda:
                torch.cuda.synchronize()
        kernels = sorted(prof.key_averages(), key=spent, reverse=True)[:8]
        row[f"Dreg_{name}_top_kernels"] = [{"name": e.key, "calls": e.count, "seconds": spent(e) / 1e6}
                                           for e in kernels]
        print(f"  batch {batch} Dreg, {name}: top kernels", flush=True)
        for e in row[f"Dreg_{name}_top_kernels"]:
            print(f"    {e['seconds'] * 1000:9.2f} ms {e['calls']:5d}x  {e['name'][:100]}", flush=True)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a checkout of NVlabs/stylegan3")
    parser.add_argument("--batches", default="4,32")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--plugins", action="store_true", help="their bias_act and upfirdn2d CUDA plugins, not the reference paths")
    parser.add_argument("--resolution", type=int, default=256)
    parser.add_argument("--cbase", type=int, default=16384)
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs the same steps there (a smoke run)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "double_backward_probe.json"))
    return parser.parse_args()


def main():
    args = parse_args()
    difference = float64_check()
    print(f"double_backward_probe: float64 R1 gradients, native against wgrad: {difference:.1e} relative", flush=True)
    if difference > 1e-10:
        raise SystemExit(f"double_backward_probe: the two formulations disagree ({difference:.1e}); nothing timed")
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("double_backward_probe: no CUDA GPU: checked the formulations in float64, timed nothing")
        sys.exit(3)
    sys.path.insert(0, HERE)
    import nvidia_train_speed as official
    repo = os.path.abspath(args.repo)
    sys.path.insert(0, repo)
    import nvidia_compat  # their code's shims for PyTorch 2.11 (the plugins' import among them)
    if not args.plugins:
        nvidia_compat.reference_ops()
    torch.backends.cudnn.benchmark = True
    where = torch.cuda.get_device_name(0) if cuda else f"CPU, {os.cpu_count()} cores"
    result = {"benchmark": "double_backward_probe", "machine": f"{where}, {platform.node()}",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "command": " ".join(sys.argv), "torch": torch.__version__, "plugins": args.plugins,
              "float64_difference": difference, "by_batch": {}, "complete": False}
    data = os.path.join(tempfile.mkdtemp(prefix="ganc_probe_"), "data256.zip")  # train.py's options need one
    official.make_dataset(data, args.resolution, 32)
    result.update(resolution=args.resolution, cbase=args.cbase,
                  title=(f"R1 (Dreg) and path length (Greg) of NVIDIA's StyleGAN2 networks at {args.resolution} pixels "
                         f"(channel base {args.cbase}), eagerly on {where}, their bias_act and upfirdn2d "
                         f"{'as CUDA plugins' if args.plugins else 'on their reference paths'}: seconds per step with "
                         "PyTorch's convolution double backward (native), with conv2d_gradfix's weight-gradient "
                         "formulation (wgrad), and with wgrad for the grouped convolutions only (grouped), median "
                         "of the timed steps"))
    for batch in (int(b) for b in args.batches.split(",")):
        options = official.dry_run_options(repo, data, batch, args.cbase, 1.0)
        torch.manual_seed(0)
        model = official.OfficialStyleGAN2(options, args.resolution).to(args.device)
        real = torch.randn(batch, 3, args.resolution, args.resolution, device=args.device)
        z = torch.randn(batch, options["G_kwargs"]["z_dim"], device=args.device)
        steps = {"Dreg": lambda: model.phase_dreg(real), "Greg": lambda: model.phase_greg(z)}
        row = result["by_batch"][str(batch)] = {}
        for phase, run in steps.items():
            grads = {}
            for name in FORMULATIONS:
                times = []
                with formulation(name):
                    for i in range(2 + args.iters):
                        torch.manual_seed(i)  # path length's noise and style mixing: alike for each
                        model.pl_mean.zero_()  # and its running mean
                        model.zero_grad(set_to_none=True)
                        times.append(timed(lambda: run().backward(), cuda))
                grads[name] = [p.grad.float().clone() for p in model.parameters() if p.grad is not None]
                row[f"{phase}_{name}_seconds"] = statistics.median(times[2:])
            line = f"batch {batch} {phase}: native {row[f'{phase}_native_seconds'] * 1000:.1f} ms"
            for name in FORMULATIONS[1:]:
                row[f"{phase}_{name}_gradient_difference"] = max(
                    ((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item()
                    for a, b in zip(grads["native"], grads[name]))
                row[f"{phase}_{name}_speedup"] = row[f"{phase}_native_seconds"] / row[f"{phase}_{name}_seconds"]
                line += (f", {name} {row[f'{phase}_{name}_seconds'] * 1000:.1f} ms "
                         f"({row[f'{phase}_{name}_speedup']:.2f}x, gradients {row[f'{phase}_{name}_gradient_difference']:.1e} apart)")
            print(line, flush=True)
        profile_dreg(model, real, row, batch, cuda)
        del model
        if cuda:
            torch.cuda.empty_cache()
        results.save(result, args.json)  # after each batch: a run stopped later keeps what it measured
    result["complete"] = True
    results.save(result, args.json)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
