"""ganc's own operators (ops/Ops.def) against the reference compositions they replace, run by
PyTorch in the same test: ganc::upfirdn2d against pad + zero insertion + a depthwise
convolution + a strided slice (StyleGAN's reference upfirdn2d), ganc::bias_act against bias +
activation + gain + clamp. Forward, backward and double backward: gradcheck and gradgradcheck
in float64, the reference's own autograd in float32 (bit for bit where the arithmetic is done
in the same order: bias_act's forward and gradients on the CPU), channels-last as contiguous,
autocast as the replaced op. The CUDA kernels are compared the same way in test_cuda.py.
"""
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def load_ops():
    path = os.environ.get("GANC_OPS", os.path.join(os.environ.get("GANC_BUILD_DIR", ""), "ops", "libganc_ops.so"))
    if not hasattr(torch.ops.ganc, "upfirdn2d"):
        torch.ops.load_library(path)
    return torch.ops.ganc


ops = load_ops()


# -- the references: the compositions the ops replace ----------------------------------------

def reference_upfirdn2d(x, f, up=(1, 1), down=(1, 1), padding=(0, 0, 0, 0), flip_filter=False, gain=1.0):
    """StyleGAN's reference formulation, from the math: zero insertion by reshape and pad, pad
    (or crop), a depthwise convolution with the filter (flipped unless flip_filter, since
    conv2d correlates), every down-th sample."""
    if f.ndim == 1:
        f = f[:, None] * f[None, :]
    n, c, h, w = x.shape
    (upx, upy), (downx, downy), (px0, px1, py0, py1) = up, down, padding
    x = x.reshape(n, c, h, 1, w, 1)
    x = F.pad(x, [0, upx - 1, 0, 0, 0, upy - 1])
    x = x.reshape(n, c, h * upy, w * upx)
    x = F.pad(x, [max(px0, 0), max(px1, 0), max(py0, 0), max(py1, 0)])
    x = x[:, :, max(-py0, 0):x.shape[2] - max(-py1, 0), max(-px0, 0):x.shape[3] - max(-px1, 0)]
    f = f * gain
    if not flip_filter:
        f = f.flip([0, 1])
    weight = f[None, None].repeat(c, 1, 1, 1).to(x.dtype)
    x = F.conv2d(x, weight, groups=c)
    return x[:, :, ::downy, ::downx]


def reference_bias_act(x, b, dim=1, act="linear", alpha=0.2, gain=1.0, clamp=-1.0):
    """StyleGAN's reference bias_act."""
    if b is not None:
        x = x + b.reshape([-1 if i == dim else 1 for i in range(x.ndim)])
    if act == "lrelu":
        x = F.leaky_relu(x, alpha)
    elif act == "relu":
        x = F.relu(x)
    if gain != 1:
        x = x * gain
    if clamp >= 0:
        x = x.clamp(-clamp, clamp)
    return x


def fir(taps, separable, dtype=torch.float64):
    """A normalised binomial filter of `taps` taps, made asymmetric (so a flip shows): 1-D, or
    a 2-D filter that is not an outer product."""
    f = torch.tensor([float(math.comb(taps - 1, k)) for k in range(taps)], dtype=dtype)
    f = f + torch.arange(taps, dtype=dtype) * 0.1
    f = f / f.sum()
    return f if separable else f[:, None] * f[None, :] + torch.eye(taps, dtype=dtype) * 0.01


# (up, down, padding, taps) in the shapes StyleGAN's resampling takes: upsample2d (up 2, 4
# taps), downsample2d (down 2), the up-and-down of filtered_lrelu, odd filters, cropping.
RESAMPLINGS = [
    ((1, 1), (1, 1), (1, 1, 1, 1), 3),
    ((2, 2), (1, 1), (2, 1, 2, 1), 4),
    ((1, 1), (2, 2), (1, 1, 1, 1), 4),
    ((4, 4), (1, 1), (5, 4, 5, 4), 8),
    ((1, 1), (4, 4), (2, 2, 2, 2), 8),
    ((2, 2), (2, 2), (3, 2, 3, 2), 6),
    ((2, 1), (1, 2), (1, 2, 0, 1), 2),
    ((1, 1), (1, 1), (-1, 2, 1, -2), 5),
]


def call(x, f, up, down, padding, flip=False, gain=1.0, origin="aten::conv2d"):
    return ops.upfirdn2d(x, f, list(up), list(down), list(padding), flip, gain, origin)


@pytest.mark.parametrize("up,down,padding,taps", RESAMPLINGS)
@pytest.mark.parametrize("separable", [False, True])
@pytest.mark.parametrize("flip", [False, True])
def test_upfirdn2d_equals_the_reference_in_float64_with_its_gradients(up, down, padding, taps, separable, flip):
    torch.manual_seed(0)
    f = fir(taps, separable)
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64, requires_grad=True)
    got = call(x, f, up, down, padding, flip, 1.7)
    want = reference_upfirdn2d(x, f, up, down, padding, flip, 1.7)
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    # Gradients and second derivatives against finite differences (on one image of two
    # channels: each output element is a perturbation), and against the reference's own
    # autograd, first and second order (R1's shape: the input gradient differentiated again).
    small = x[:1, :2, :6, :5].detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: call(t, f, up, down, padding, flip, 1.7), (small,))
    assert torch.autograd.gradgradcheck(lambda t: call(t, f, up, down, padding, flip, 1.7), (small,))
    cot = torch.randn_like(want, requires_grad=True)
    g_got, = torch.autograd.grad(got, x, cot, create_graph=True)
    g_want, = torch.autograd.grad(want, x, cot, create_graph=True)
    assert torch.allclose(g_got, g_want, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(g_want)
    gg_got, = torch.autograd.grad((g_got * weights).sum(), cot)
    gg_want, = torch.autograd.grad((g_want * weights).sum(), cot)
    assert torch.allclose(gg_got, gg_want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("up,down,padding,taps", RESAMPLINGS[:6])
def test_upfirdn2d_in_float32_and_channels_last(up, down, padding, taps):
    """Within 1e-6 of the reference's largest magnitude in float32 (the sums run in another
    order than the convolution's); channels-last in, channels-last out, the same numbers."""
    torch.manual_seed(1)
    f = fir(taps, separable=False, dtype=torch.float32)
    x = torch.randn(2, 5, 9, 8, requires_grad=True)
    got = call(x, f, up, down, padding)
    want = reference_upfirdn2d(x, f, up, down, padding)
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()
    cot = torch.randn_like(want)
    g_got, = torch.autograd.grad(got, x, cot)
    g_want, = torch.autograd.grad(want, x, cot)
    assert (g_got - g_want).abs().max() <= 1e-6 * g_want.abs().max()
    last = x.detach().to(memory_format=torch.channels_last)
    y = call(last, f, up, down, padding)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, got.detach())
    for dtype in (torch.float16, torch.bfloat16):  # float32 arithmetic, one rounding at the end
        low = call(x.detach().to(dtype), f, up, down, padding)
        assert low.dtype == dtype
        exact = call(x.detach().to(dtype).double(), f.double(), up, down, padding)
        assert (low.double() - exact).abs().max() <= torch.finfo(dtype).eps * exact.abs().max()


def test_upfirdn2d_refuses_what_it_cannot_compute():
    x = torch.randn(1, 2, 4, 4)
    with pytest.raises(RuntimeError, match=r"ganc::upfirdn2d: x must be \[N, C, H, W\]"):
        call(x[0], torch.ones(3), (1, 1), (1, 1), (1, 1, 1, 1))
    with pytest.raises(RuntimeError, match="ganc::upfirdn2d: no output"):
        call(x, torch.ones(3), (1, 1), (1, 1), (-4, -4, 0, 0))
    with pytest.raises(RuntimeError, match="up and down must be at least 1"):
        call(x, torch.ones(3), (0, 1), (1, 1), (1, 1, 1, 1))
    with pytest.raises(RuntimeError, match="the filter takes no gradient"):
        call(x, torch.ones(3, requires_grad=True), (1, 1), (1, 1), (1, 1, 1, 1))


def test_upfirdn2d_is_cast_by_autocast_as_the_convolution_it_replaced():
    """On the CPU autocast casts conv2d to bfloat16 and leaves aten::_convolution alone: the
    op follows the origin it names."""
    x = torch.randn(1, 2, 6, 6)
    f = fir(4, separable=True, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = reference_upfirdn2d(x, f, (2, 2), (1, 1), (2, 1, 2, 1))
        cast = call(x, f, (2, 2), (1, 1), (2, 1, 2, 1), origin="aten::conv2d")
        kept = call(x, f, (2, 2), (1, 1), (2, 1, 2, 1), origin="aten::_convolution")
    assert want.dtype == cast.dtype == torch.bfloat16
    assert kept.dtype == torch.float32


ACTIVATIONS = [("linear", 1.0, -1.0), ("lrelu", float(np.sqrt(2)), -1.0), ("lrelu", float(np.sqrt(2)), 0.5),
               ("relu", 2.0, 0.3), ("linear", 1.0, 0.4)]


@pytest.mark.parametrize("act,gain,clamp", ACTIVATIONS)
@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5, 4)])
def test_bias_act_equals_the_reference_with_its_gradients(act, gain, clamp, shape):
    torch.manual_seed(2)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    b = torch.randn(shape[1], dtype=torch.float64, requires_grad=True)
    got = ops.bias_act(x, b, 1, act, 0.2, gain, clamp)
    want = reference_bias_act(x, b, 1, act, 0.2, gain, clamp)
    assert torch.equal(got, want)
    assert torch.autograd.gradcheck(lambda t, c: ops.bias_act(t, c, 1, act, 0.2, gain, clamp), (x, b))
    assert torch.autograd.gradgradcheck(lambda t, c: ops.bias_act(t, c, 1, act, 0.2, gain, clamp), (x, b))
    # float32: forward, both gradients and the second order bit for bit (on the CPU the op
    # runs the reference's kernels in the reference's order, its double backward's too).
    x32, b32 = x.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    got, want = ops.bias_act(x32, b32, 1, act, 0.2, gain, clamp), reference_bias_act(x32, b32, 1, act, 0.2, gain, clamp)
    assert torch.equal(got, want)
    cot = torch.randn_like(want, requires_grad=True)
    (gx, gb), (wx, wb) = torch.autograd.grad(got, (x32, b32), cot, create_graph=True), \
        torch.autograd.grad(want, (x32, b32), cot, create_graph=True)
    assert torch.equal(gx, wx) and torch.equal(gb, wb)
    weights = torch.randn_like(wx)
    gg, = torch.autograd.grad((gx * weights).sum(), cot)
    ww, = torch.autograd.grad((wx * weights).sum(), cot)
    assert torch.equal(gg, ww)


def test_bias_act_without_a_bias_in_channels_last_and_half():
    torch.manual_seed(3)
    x = torch.randn(2, 4, 3, 3).to(memory_format=torch.channels_last)
    got = ops.bias_act(x, None, 1, "lrelu", 0.2, 1.5, 0.8)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, reference_bias_act(x, None, 1, "lrelu", 0.2, 1.5, 0.8))
    b = torch.randn(4)
    half = ops.bias_act(x.half(), b.half(), 1, "lrelu", 0.2, 1.5, -1.0)
    exact = reference_bias_act(x.half().double(), b.half().double(), 1, "lrelu", 0.2, 1.5, -1.0)
    assert half.dtype == torch.float16
    assert (half.double() - exact).abs().max() <= 2 * torch.finfo(torch.float16).eps * exact.abs().max()


def test_bias_act_refuses_what_it_cannot_compute():
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="ganc::bias_act: no activation 'tanh'"):
        ops.bias_act(x, None, 1, "tanh", 0.2, 1.0, -1.0)
    with pytest.raises(RuntimeError, match=r"ganc::bias_act: b must be 1-D of 3"):
        ops.bias_act(x, torch.zeros(4), 1, "linear", 0.2, 1.0, -1.0)


def test_the_library_registers_exactly_the_ops_of_its_table():
    """What the dispatcher knows of the library is ops/Ops.def's rows, no more, no fewer."""
    registered = {name.split("::")[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("ganc::")}
    text = open(os.path.join(HERE, "..", "..", "ops", "Ops.def")).read()
    rows = {line[len("GANC_OP("):].split(",")[0] for line in text.splitlines() if line.startswith("GANC_OP(")}
    assert rows == registered == {"upfirdn2d", "bias_act", "bias_act_backward", "convolution", "sync_batch_norm"}
