"""A traced network is checked by what training uses of it: with its parameters perturbed once,
on inputs at two scales, its outputs, its first derivatives with respect to its inputs and
parameters, and its second derivatives where a phase differentiates it twice, against eager.
What a trace would silently change (a weight frozen as a constant, an in-place change of a
parameter, a `torch.no_grad()` block that changes gradients, hooks, a buffer updated with a
value that carries gradient, an in-place autograd Function, two signatures) is refused at
export in one line naming the submodule, the file:line and the construct; the archive is not
written.
"""
import inspect
import os
import re

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ganc
import ganc.trace_derivatives
from ganc.exporter import _probe
from ganc.scriptable import make_scriptable
from test_intake import TinyGAN, tiny_spec


class Net(nn.Module):
    """A discriminator that does not script (**kwargs), so the export traces it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)
        self.register_buffer("avg", torch.zeros(4))

    def forward(self, x, **kwargs):
        return self.out(F.leaky_relu(self.body(x), 0.2))

    def body(self, x):
        return self.lin(x)


class GAN(TinyGAN):
    """test_intake's tiny GAN (its three phases: D, R1 every 2 steps, G) around a given D."""

    def __init__(self, discriminator):
        nn.Module.__init__(self)
        self.generator = nn.Linear(2, 4)
        self.discriminator = discriminator


def spec():
    return tiny_spec()


def line_of(obj, text):
    """test_trace_check.py:N of the line of `obj`'s source holding `text`."""
    lines, start = inspect.getsourcelines(obj)
    return f"test_trace_check.py:{start + next(i for i, line in enumerate(lines) if text in line)}"


def refusal(gan, tmp_path) -> str:
    """The one-line ExportError exporting `gan` raises; nothing is written."""
    with pytest.raises(ganc.ExportError) as info:
        ganc.export(gan, str(tmp_path / "m.pt"), spec(), verbose=False)
    message = str(info.value)
    assert "\n" not in message
    assert not os.path.exists(tmp_path / "m.pt")
    return message


# -- constructs a trace would change, each refused by name ------------------------------------

class ReadByNumpy(Net):
    def body(self, x):
        return F.linear(x, torch.from_numpy(self.lin.weight.detach().numpy()), self.lin.bias)


class ReadByAsarray(Net):
    def body(self, x):
        return F.linear(x, torch.as_tensor(np.asarray(self.lin.weight.detach())), self.lin.bias)


class ReadByData(Net):
    def body(self, x):
        return F.linear(x, self.lin.weight.data, self.lin.bias)


class ClampedInForward(Net):
    def body(self, x):
        self.lin.weight.data.clamp_(-0.3, 0.3)  # WGAN's weight clipping, written in forward
        return self.lin(x)


class TensorHook(Net):
    def body(self, x):
        h = self.lin(x)
        if h.requires_grad:
            h.register_hook(lambda g: g.clamp(-0.01, 0.01))
        return h


class BufferWithGradient(Net):
    def body(self, x):
        h = self.lin(x)
        self.avg.mul_(0.9).add_(0.1 * h.mean(0))
        return h


class NoGradChangesGradient(Net):
    def body(self, x):
        with torch.no_grad():
            norm = x.norm(dim=1, keepdim=True) + 1
        return self.lin(x / norm)


def halve(module, args, output):
    return output * 0.5


def shift(module, args):
    return (args[0] + 1,)


class ForwardHook(Net):
    def __init__(self):
        super().__init__()
        self.lin.register_forward_hook(halve)


class PreHook(Net):
    def __init__(self):
        super().__init__()
        self.lin.register_forward_pre_hook(shift)


class AddInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.add_(1)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class DirtyFunction(Net):
    def body(self, x):
        return AddInPlace.apply(self.lin(x) * 1)


class ClampStraightThrough(torch.autograd.Function):
    """Clamps at +-3 and passes the gradient straight through: equal to its forward's gradient
    on small inputs only."""

    @staticmethod
    def forward(ctx, x):
        return x.clamp(-3, 3)

    @staticmethod
    def backward(ctx, grad):
        return grad


class Clamped(Net):
    def body(self, x):
        return ClampStraightThrough.apply(self.lin(x))


@pytest.mark.parametrize("net,marker,construct", [
    (ReadByNumpy, ".numpy()", r"parameter 'discriminator\.lin\.weight' read as a value \(\.numpy\(\)\)"),
    (ReadByAsarray, "np.asarray", r"parameter 'discriminator\.lin\.weight' read as a value \(np\.asarray\)"),
    (ReadByData, "weight.data", r"parameter 'discriminator\.lin\.weight' read as a value \(\.data\)"),
    (ClampedInForward, "clamp_", r"parameter 'discriminator\.lin\.weight' changed in place in forward "
                                 r"\(\.clamp_\(\)\)"),
    (TensorHook, "register_hook", r"a tensor hook \(tensor\.register_hook\)"),
    (BufferWithGradient, "self.avg", r"buffer 'discriminator\.avg' updated in place with a value that carries "
                                     r"gradient \(\.add_\(\)\)"),
])
def test_what_a_trace_would_change_is_refused_by_name(tmp_path, net, marker, construct):
    message = refusal(GAN(net()), tmp_path)
    assert re.search(rf"^ganc.export: discriminator \(.*{re.escape(line_of(net, marker))}\): {construct} in a module "
                     r"that does not script \(.*\): ", message), message


class ReadThroughACopy(Net):
    """Read from a copy of the weight: no read of the parameter itself for the probe to see."""

    def body(self, x):
        return F.linear(x, torch.from_numpy(self.lin.weight.detach().double().numpy()).float(), self.lin.bias)


def test_a_weight_frozen_out_of_the_probes_sight_is_found_by_perturbing_it(tmp_path):
    message = refusal(GAN(ReadThroughACopy()), tmp_path)
    where = re.escape(line_of(ReadThroughACopy, "from_numpy"))
    assert re.search(r"^ganc.export: discriminator \(ReadThroughACopy, .*\): with its parameters changed, its "
                     r"trace computes otherwise than eager at forward\(\[8, 4\]\) \(by [0-9.e+-]+ relative\): the "
                     r"trace froze a parameter's value at export \(parameter 'lin\.weight' is a constant of the "
                     rf"trace, recorded at .*{where}\)", message), message


def test_a_no_grad_block_that_changes_gradients_is_refused_by_name(tmp_path):
    """Its outputs equal eager's; its input gradient does not."""
    message = refusal(GAN(NoGradChangesGradient()), tmp_path)
    where = re.escape(line_of(NoGradChangesGradient, "no_grad"))
    assert re.search(r"^ganc.export: discriminator \(NoGradChangesGradient, .*\): its trace's first derivative "
                     r"with respect to (input 0 \[8, 4\]|parameter '\w+(\.\w+)*') differs from eager's at "
                     rf"forward\(\[8, 4\]\) \(by [0-9.e+-]+ relative\): a torch.no_grad\(\) block in discriminator "
                     rf"\(.*{where}\): a trace records its operations with gradients", message), message


@torch.no_grad()
def norm_of(x):
    return x.norm(dim=1, keepdim=True) + 1


class NoGradHelper(Net):
    def body(self, x):
        return self.lin(x / norm_of(x))


class InferenceModeBlock(Net):
    def body(self, x):
        with torch.inference_mode():
            norm = x.norm(dim=1, keepdim=True) + 1
        return self.lin(x / norm.clone())


@pytest.mark.parametrize("net,construct,where", [
    (NoGradHelper, r"a @torch.no_grad\(\) function \(norm_of\)", lambda: line_of(norm_of, "no_grad")),
    (InferenceModeBlock, r"a torch.inference_mode\(\) block", lambda: line_of(InferenceModeBlock, "inference_mode"))],
    ids=["no_grad_helper", "inference_mode"])
def test_a_gradient_block_is_named_by_its_own_line(tmp_path, net, construct, where):
    """A `@torch.no_grad()` helper is named by its own first line (once: the forward's line that
    calls it), and a `torch.inference_mode()` block by its `with` line (once: not named)."""
    message = refusal(GAN(net()), tmp_path)
    assert re.search(rf"differs from eager's at forward\(\[8, 4\]\) \(by [0-9.e+-]+ relative\): {construct} in "
                     rf"discriminator \(.*{re.escape(where())}\): a trace records its operations with gradients",
                     message), message


class NoGradBufferUpdate(Net):
    """Eager updates the buffer without gradient; a trace records the update with gradients."""

    def body(self, x):
        with torch.no_grad():
            self.avg.copy_(x.mean(0))
        return self.lin(x) + self.avg


def test_a_buffer_a_trace_would_update_with_gradients_is_refused(tmp_path):
    """The export once wrote this archive, and training stopped at step 1 ("backward through
    the graph a second time")."""
    message = refusal(GAN(NoGradBufferUpdate()), tmp_path)
    where = re.escape(line_of(NoGradBufferUpdate, "no_grad"))
    assert re.search(r"^ganc.export: discriminator \(NoGradBufferUpdate, .*\): its trace updates buffer "
                     rf"discriminator\.avg in place in a torch.no_grad\(\) block \(.*{where}\) with a value that "
                     r"carries gradient at forward\(\[8, 4\]\), where eager's update does not", message), message


@pytest.mark.parametrize("net,hook,kind", [(ForwardHook, halve, "forward hook"),
                                           (PreHook, shift, "forward pre-hook")])
def test_hooks_inside_a_traced_network_are_refused_naming_the_hook(tmp_path, net, hook, kind):
    message = refusal(GAN(net()), tmp_path)
    where = re.escape(f"test_trace_check.py:{inspect.getsourcelines(hook)[1]}")
    assert re.search(rf"^ganc.export: discriminator\.lin \(Linear\): a {kind} \({hook.__name__}, .*{where}\) on a "
                     r"module inside a network that does not script", message), message
    assert "container.py" not in message and "module.py" not in message


def test_an_autograd_function_that_changes_its_input_in_place_is_refused(tmp_path):
    message = refusal(GAN(DirtyFunction()), tmp_path)
    where = re.escape(f"test_trace_check.py:{inspect.getsourcelines(AddInPlace.forward)[1]}")
    assert re.search(rf"^ganc.export: torch.autograd.Function AddInPlace \(.*{where}\) in discriminator: its forward "
                     r"changes an input in place \(ctx\.mark_dirty\)", message), message


def test_a_straight_through_function_is_checked_beyond_the_probes_inputs(tmp_path):
    """Clamping at +-3 equals its forward's gradient on the probe's inputs; ten times them
    shows the difference."""
    message = refusal(GAN(Clamped()), tmp_path)
    assert re.search(r"^ganc.export: torch.autograd.Function ClampStraightThrough \(.*\) in discriminator: its "
                     r"backward is not the gradient of its forward \(the first derivatives differ by [0-9.e+-]+ "
                     r"relative on inputs 10 times those the probe saw\)", message), message


class ClampAt(torch.autograd.Function):
    """A straight-through clamp at +-bound (bound given as a Python number)."""

    @staticmethod
    def forward(ctx, x, bound):
        return x.clamp(-bound, bound)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ClampedAt(Net):
    def __init__(self, bound):
        super().__init__()
        self.bound = bound

    def body(self, x):
        return ClampAt.apply(self.lin(x), self.bound)


@pytest.mark.parametrize("bound", [20.0, 100.0, 1e5])
def test_a_straight_through_function_is_refused_whatever_its_bound(tmp_path, bound):
    """A clamp at +-20 or +-100 agrees with its forward's gradient on the probe's inputs and at
    ten times them, and once exported silently; the check climbs until the bound shows."""
    message = refusal(GAN(ClampedAt(bound)), tmp_path)
    assert re.search(r"^ganc.export: torch.autograd.Function ClampAt \(.*\) in discriminator: its backward is not "
                     r"the gradient of its forward \(the first derivatives differ by [0-9.e+-]+ relative on inputs "
                     r"[0-9.e+]+ times those the probe saw\)", message), message


class SoftplusFunction(torch.autograd.Function):
    """Softplus with its exact derivative as its backward: the forward's own derivative (exp
    over 1 + exp) overflows to NaN on large inputs where this backward does not."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.log1p(torch.exp(x))

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return grad * torch.sigmoid(x)


class Softplussed(Net):
    def body(self, x):
        return SoftplusFunction.apply(self.lin(x))


def test_a_function_whose_forward_overflows_at_large_inputs_still_exports(tmp_path):
    """The ladder of scales compares only where both gradients are finite."""
    gan = GAN(Softplussed())
    ganc.export(gan, str(tmp_path / "m.pt"), spec(), verbose=False)
    assert os.path.exists(tmp_path / "m.pt")


def test_a_global_module_hook_is_refused_naming_it(tmp_path):
    def everywhere(module, args, output):
        return output

    handle = torch.nn.modules.module.register_module_forward_hook(everywhere)
    try:
        message = refusal(GAN(Harmless()), tmp_path)
    finally:
        handle.remove()
    where = re.escape(f"test_trace_check.py:{inspect.getsourcelines(everywhere)[1]}")
    assert re.search(rf"^ganc.export: a global module hook \(.*everywhere, .*{where}, registered with "
                     r"torch\.nn\.modules\.module\.register_module_forward_hook\)", message), message


class TwoSignatures(GAN):
    def phase_g(self, z):
        fake = self.generator(z)
        return F.softplus(-self.discriminator(fake, fake)).mean()


class TwoInputs(Net):
    def forward(self, x, y=None, **kwargs):
        return self.out(self.lin(x if y is None else x + y))


def test_a_traced_network_called_with_two_signatures_is_refused_in_one_line(tmp_path):
    message = refusal(TwoSignatures(TwoInputs()), tmp_path)
    assert re.search(r"^ganc.export: discriminator \(TwoInputs, .*test_trace_check.py:\d+\) does not script and "
                     r"its forward is called with 1 tensor by phase 'd' \(forward\(\[8, 4\]\)\) and 2 by phase 'g' "
                     r"\(forward\(\[8, 4\], \[8, 4\]\)\): a traced method takes one signature", message), message


# -- what is not refused ----------------------------------------------------------------------

class Harmless(Net):
    """A no_grad block that changes no gradient, a buffer updated with a detached value, and a
    parameter's .detach() (the trace records it)."""

    def body(self, x):
        with torch.no_grad():
            self.avg.copy_(x.detach().mean(0))
        return self.lin(x) + self.avg + 0 * self.lin.weight.detach().sum()


def test_a_trace_that_trains_like_eager_exports_with_its_derivatives_equal(tmp_path):
    torch.manual_seed(0)
    gan = GAN(Harmless())
    path = str(tmp_path / "m.pt")
    ganc.export(gan, path, spec(), verbose=False)
    loaded = torch.jit.load(path)
    real = torch.randn(8, 4)
    want = gan.phase_dreg(real)
    got = loaded.phase_dreg(real)
    assert torch.equal(want, got)
    for a, b in zip(torch.autograd.grad(want, list(gan.discriminator.parameters()), allow_unused=True),
                    torch.autograd.grad(got, list(loaded.discriminator.parameters()), allow_unused=True)):
        assert (a is None) == (b is None)
        assert a is None or torch.allclose(a, b, rtol=1e-6, atol=0)


def scaled(w):
    """StyleGAN2's float16 weight scaling: `1 / np.sqrt(fan_in)` over the weight's largest
    magnitude. Eager computes the division as the reciprocal times a NumPy float; the tracer
    records the size as a tensor and divides: a rounding apart, in some elements."""
    return w * ((1 / np.sqrt(w.shape[1])) / w.norm(float("inf"), dim=1, keepdim=True))


class HalfNoise(Net):
    """A float16 stack with a scalar noise strength (StyleGAN2's per-layer `noise_strength`)
    whose gradient sums noise times gradient over a whole activation: terms of both signs, so
    roundings that differ between the trace and eager move it by far more than a rounding."""

    def __init__(self, width=1500, depth=4):
        super().__init__()
        self.wide = nn.Parameter(torch.randn(width, 60))
        self.mid = nn.ParameterList([nn.Parameter(torch.randn(width, width)) for _ in range(depth)])
        self.back = nn.Parameter(torch.randn(4, width))
        self.strength = nn.Parameter(torch.zeros([]))

    def body(self, x):
        h = F.linear(x.repeat(1, 15).half(), scaled(self.wide).half())
        h = h + torch.randn_like(h) * self.strength.half()
        for m in self.mid:
            h = F.leaky_relu(F.linear(h, scaled(m).half()), 0.2)
        return F.linear(h, scaled(self.back).half()).float()


def test_a_float16_trace_is_judged_against_eager_s_own_rounding(tmp_path, monkeypatch):
    """A trace computing in float16 whose derivatives differ from eager's by rounding alone
    exports: each derivative past the tolerance is judged against how far eager's own moves
    when its inputs and parameters move by one float16 rounding. Judged by the tolerance
    alone, the same network is refused (what refused NVIDIA's StyleGAN2 at 256 pixels)."""
    torch.manual_seed(0)
    ganc.export(GAN(HalfNoise()), str(tmp_path / "m.pt"), spec(), verbose=False)
    assert os.path.exists(tmp_path / "m.pt")
    monkeypatch.setattr(ganc.trace_derivatives, "_ROUNDING_FLOOR", 0.0)
    torch.manual_seed(0)
    (tmp_path / "no_floor").mkdir()
    message = refusal(GAN(HalfNoise()), tmp_path / "no_floor")
    assert re.search(r"its trace's (first|second) derivative with respect to .* differs from eager's .*\(by "
                     r"[0-9.e+-]+ relative; eager's own moves by [0-9.e+-]+ when its inputs and parameters move "
                     r"by one float16 rounding\)", message), message


class HalfNoGrad(Net):
    def body(self, x):
        with torch.no_grad():
            norm = x.norm(dim=1, keepdim=True) + 1
        return F.linear((x / norm).half(), self.lin.weight.half(), self.lin.bias.half()).float()


def test_a_float16_trace_that_differentiates_otherwise_is_still_refused(tmp_path):
    """Eager's rounding noise excuses rounding, not a derivative the trace takes otherwise."""
    message = refusal(GAN(HalfNoGrad()), tmp_path)
    assert re.search(r"its trace's first derivative with respect to .* differs from eager's at forward\(\[8, 4\]\) "
                     r"\(by [0-9.e+-]+ relative; eager's own moves by [0-9.e+-]+ when its inputs and parameters "
                     r"move by one float16 rounding\): a torch.no_grad\(\) block in discriminator", message), message


def test_the_probe_knows_which_calls_a_phase_differentiates_twice():
    """R1 differentiates D twice (its phase takes torch.autograd.grad with create_graph); G is
    called by phases that differentiate once: only D's calls get the second-order check."""
    model = make_scriptable(GAN(Net()))
    probe = _probe(model, ganc.validate(spec(), model))
    assert [c.twice for c in probe.calls["discriminator"]] == [True]
    assert [c.twice for c in probe.calls["generator"]] == [False]
    assert [c.phase for c in probe.calls["discriminator"]] == ["d"]


# -- hooks outside the networks' code -----------------------------------------------------------

class HookedInInit(Harmless):
    def __init__(self):
        super().__init__()
        self.lin.weight.register_hook(lambda g: g * 0.1)


def scale_gradient(g):
    return g * 0.1


def hooked_after(gan):
    gan.generator.weight.register_hook(scale_gradient)
    return gan


def hooked_after_accumulation(gan):
    gan.discriminator.lin.bias.register_post_accumulate_grad_hook(lambda p: None)
    return gan


@pytest.mark.parametrize("build,name,line", [
    (lambda: GAN(HookedInInit()), r"HookedInInit\.__init__\.<locals>\.<lambda>",
     re.escape(line_of(HookedInInit, "register_hook"))),
    (lambda: hooked_after(GAN(Harmless())), "scale_gradient",
     f"test_trace_check.py:{inspect.getsourcelines(scale_gradient)[1]}"),
    (lambda: hooked_after_accumulation(GAN(Harmless())), r"hooked_after_accumulation\.<locals>\.<lambda>",
     re.escape(line_of(hooked_after_accumulation, "register_post")))])
def test_a_gradient_hook_on_a_parameter_is_refused_naming_it(tmp_path, build, name, line):
    """A hook registered outside forward (in __init__, or on the built GAN) once exported
    silently: the archive's gradient norm was 0.405 where eager's was 0.0405. Scripted
    (TinyGAN's G) and traced (Net) networks alike."""
    message = refusal(build(), tmp_path)
    assert re.search(rf"^ganc.export: parameter '(discriminator\.lin\.(weight|bias)|generator\.weight)' has a "
                     rf"gradient hook \({name}, .*{line}, registered with register_(post_accumulate_grad_)?hook\)",
                     message), message


# -- a module shared by two networks --------------------------------------------------------------

class SharedBlockGAN(GAN):
    """PyTorch-GAN's UNIT in small: one block registered in both networks (its encoders share
    their last residual block). The export once ended in a raw KeyError from inside ganc; an
    archive that took it would reduce and step the block twice."""

    def __init__(self):
        super().__init__(Harmless())
        shared = nn.Linear(4, 4)
        self.generator = nn.Sequential(nn.Linear(2, 4), shared)
        self.discriminator.shared = shared


def test_a_module_shared_by_two_networks_is_refused_in_one_line(tmp_path):
    message = refusal(SharedBlockGAN(), tmp_path)
    assert re.search(r"^ganc.export: parameter 'generator\.1\.weight' is reachable as 'discriminator\.shared\.weight' "
                     r"too \(a module or tensor shared by two networks, here 'discriminator\.shared'\)",
                     message), message
