"""A trace checked by what training uses of it (step 3 of ganc.hybrid, after its outputs): with
its parameters perturbed once, on inputs at two spreads, its first derivatives with respect to
its inputs and parameters, and its second derivatives where a phase differentiates it twice,
against eager's. A derivative of a trace that computes in float16 or bfloat16 is judged against
eager's own rounding noise where it is past the tolerance."""
from __future__ import annotations

import contextlib
import random
import re
from dataclasses import dataclass, replace

import torch

from .probe import _OWN_DIR, _TORCH_DIR, _clone, _np
from .scriptable import ExportError, _location
from .trace_calls import describe, eager_of, traced_of

__all__ = ["check_derivatives", "rng_kept"]

# Outputs of a trace computing in float32 or wider agree with eager's to this, relative.
_EXACT = 1e-5


@contextlib.contextmanager
def rng_kept():
    """Leaves the Python, numpy and torch generators as they were."""
    states = (random.getstate(), _np.random.get_state() if _np is not None else None, torch.get_rng_state())
    try:
        yield
    finally:
        random.setstate(states[0])
        if _np is not None:
            _np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _second_input(args, spread: float = 1.0):
    """Other values of the same shapes and dtypes (float tensors redrawn with their mean and
    `spread` times their spread, integer tensors permuted)."""
    out = []
    g = torch.Generator().manual_seed(12345)
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() > 1:
            std = (a.float().std().item() or 1.0) * spread
            out.append((torch.randn(a.shape, generator=g) * std + a.float().mean().item()).to(a.dtype))
        elif isinstance(a, torch.Tensor) and a.numel() > 1:
            out.append(a.flatten()[torch.randperm(a.numel(), generator=g)].reshape(a.shape))
        else:
            out.append(a)
    return tuple(out)

def _by(difference: float) -> str:
    """ " (by 0.5 relative)", or nothing where the trace failed or its outputs differ in kind."""
    return f" (by {difference:.2g} relative)" if difference != float("inf") else ""


# -- derivatives: what training uses of a trace -------------------------------------------------

def _tensors(out) -> list:
    """The tensors of an output, in a fixed order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _tensors(out[k])]
    return []


@dataclass
class _Derivatives:
    """A network's outputs on one input, the first derivatives of its outputs (against fixed
    random cotangents) with respect to each floating input and parameter, and the derivatives
    of the input gradients (against fixed random weights) with respect to the same: what R1
    and path length differentiate. `names` says what each derivative is taken with respect to."""
    outputs: list
    names: list
    first: list | None = None
    second: list | None = None
    failure: str = ""
    tainted: list | None = None  # buffers left with an autograd history by the run


def _derivatives(fn, module, call, args, order: int) -> _Derivatives:
    """`fn` on `args` as `_run` runs it (same torch seed, `module`'s state restored after),
    differentiated to `order` (0: outputs only). Where the second derivative cannot be taken
    it is left None and why is kept in `failure`."""
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    module.train(call.training)
    try:
        with rng_kept(), torch.set_grad_enabled(order > 0):
            torch.manual_seed(7)
            inputs = tuple(a.detach().clone().requires_grad_(order > 0)
                           if isinstance(a, torch.Tensor) and a.is_floating_point() else _clone(a) for a in args)
            outs = _tensors(fn(*inputs))
            tainted = [n for n, b in module.named_buffers() if b.requires_grad]
            wrt_inputs = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
            names = [f"input {i} {list(a.shape)}" for i, a in enumerate(inputs)
                     if isinstance(a, torch.Tensor) and a.requires_grad] + [f"parameter {n!r}" for n, _ in params]
            found = _Derivatives([o.detach() for o in outs], names, tainted=tainted)
            differentiable = [o for o in outs if o.requires_grad]
            if order == 0 or not differentiable:
                return found
            wrt = wrt_inputs + [p for _, p in params]
            gen = torch.Generator().manual_seed(0)
            cotangents = [torch.randn(o.shape, generator=gen).to(o) for o in differentiable]
            first = torch.autograd.grad(differentiable, wrt, cotangents, create_graph=order > 1, allow_unused=True)
            found.first = [None if g is None else g.detach() for g in first]
            if order > 1:
                terms = [(g * torch.randn(g.shape, generator=gen).to(g)).sum()
                         for g in first[:len(wrt_inputs)] if g is not None and g.requires_grad]
                if terms:
                    try:
                        second = torch.autograd.grad([sum(terms)], wrt, allow_unused=True)
                        found.second = [None if g is None else g.detach() for g in second]
                    except RuntimeError as e:
                        found.failure = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return found
    finally:
        with torch.no_grad():
            for k, v in module.state_dict().items():
                v.copy_(state[k])
        for b in module.buffers():
            if b.requires_grad:
                b.detach_()  # the history an update with gradients left


def _differences(got: list, want: list):
    """The relative difference of each pair of derivatives, relative to the larger of its eager
    tensor's largest magnitude and a millionth of the largest over all of them (a derivative
    eager computes as zero is not compared to 0): inf where the shapes differ; None where
    eager's are not all finite (nothing to compare)."""
    def dense(g, like):
        return torch.zeros_like(like) if g is None else g.double()
    pairs = [(g, w) for g, w in zip(got, want)]
    want_dense = [dense(w, g if g is not None else torch.zeros(0)) for g, w in pairs]
    if not all(bool(torch.isfinite(w).all()) for w in want_dense):
        return None
    top = max([w.abs().max().item() for w in want_dense if w.numel()], default=0.0)
    out = []
    for (g, _), w in zip(pairs, want_dense):
        g = dense(g, w)
        if g.shape != w.shape:
            out.append(float("inf"))
            continue
        if not w.numel():
            out.append(0.0)
            continue
        scale = max(w.abs().max().item(), 1e-6 * top, 1e-30)
        difference = (g - w).abs().max().item() / scale
        out.append(difference if difference == difference else float("inf"))
    return out


def _worst(got: list, want: list):
    """(largest relative difference, its index) of _differences; None where eager's
    derivatives are not all finite."""
    differences = _differences(got, want)
    if differences is None:
        return None
    worst, where = 0.0, 0
    for i, difference in enumerate(differences):
        if difference > worst:
            worst, where = difference, i
    return worst, where


@contextlib.contextmanager
def _moved(module, move, seed: int):
    """The module's floating parameters each changed in place by `move(p, generator)` (under
    no_grad, one generator seeded with `seed`, in parameter order); its whole state restored
    after."""
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point() and p.numel():
                move(p, gen)
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in module.state_dict().items():
                v.copy_(state[k])


def _perturbed(module):
    """The module's floating parameters moved once by a tenth of their mean magnitude (a
    parameter a trace froze at its export value now computes otherwise); restored after."""
    def move(p, gen):
        scale = 0.1 * (p.detach().float().abs().mean().item() + 1e-3)
        p.add_((torch.randn(p.shape, generator=gen) * scale).to(p))
    return _moved(module, move, 2025)


def _jittered(module, step: float):
    """The module's floating parameters each moved by `step` relative (one rounding of the
    precision a trace computes in), at random; restored after."""
    def move(p, gen):
        p.mul_((1 + step * torch.randn(p.shape, generator=gen, dtype=torch.float64)).to(p.dtype))
    return _moved(module, move, 2026)


def _frozen_constants(traced, methods, state) -> str:
    """Where a trace holds a parameter's export value as a constant: " (parameter 'w' is a
    constant of the trace, recorded at file:line)", or nothing."""
    params = {name: value for name, value in state.items()}
    for method in methods:
        for node in getattr(traced, method).inlined_graph.nodes():
            if node.kind() != "prim::Constant" or not isinstance(node.output().type(), torch._C.TensorType):
                continue
            value = node.t("value")
            for name, p in params.items():
                if (p.shape == value.shape and p.is_floating_point() and value.is_floating_point()
                        and torch.equal(p, value.to(p.dtype))):
                    # The tracer's stack, innermost first: "file(line): function" per line.
                    frames = [(f, int(n)) for f, n in re.findall(r"^(.*)\((\d+)\): ", node.sourceRange(), re.M)
                              if not (f.startswith(_TORCH_DIR) or f.startswith(_OWN_DIR))]
                    at = f", recorded at {_location(*frames[0])}" if frames else ""
                    return f" (parameter {name!r} is a constant of the trace{at})"
    return ""


def _jittered_inputs(args, step: float):
    gen = torch.Generator().manual_seed(2027)
    return tuple(a * (1 + step * torch.randn(a.shape, generator=gen, dtype=torch.float64)).to(a.dtype)
                 if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


# A derivative of a trace that computes in a reduced precision may differ from eager's by this
# many times what eager's own moves when its inputs and parameters move by one rounding.
_ROUNDING_FLOOR = 4.0


def check_derivatives(module, traced, calls, methods, name, path, probe, tolerance, hint, rounding=None):
    """The trace against eager with the parameters perturbed once, on each recorded call and
    on a second input at ten times its spread: outputs, first derivatives
    with respect to inputs and parameters, and second derivatives where a phase
    differentiates this network twice. Returns the worst relative difference of the
    derivatives; raises ExportError naming what differs and, where the probe saw one, the
    construct that made it differ.

    `rounding`: (name, step) of the reduced precision the trace computes in, or None. There a
    derivative that sums many terms of both signs (the gradient of a scalar noise strength
    over a whole activation) can differ from eager's by far more than a rounding, because the
    trace rounds a few values otherwise (Python arithmetic on sizes recorded as tensor
    operations). Such a derivative is judged against eager's own sensitivity: eager run again
    with its inputs and parameters moved by one rounding step; it passes within
    _ROUNDING_FLOOR times that."""
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    gradient_tolerance = max(1e-4, 4 * tolerance)
    worst = 0.0
    with _perturbed(module):
        for call in calls:
            order = (2 if call.twice else 1) if call.grad else 0
            variants = [("at", call.args)]
            if any(isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() > 1 for a in call.args):
                # (A second input at the call's own spread was compared above, parameters as exported.)
                variants.append(("with inputs at ten times the spread of", _second_input(call.args, spread=10.0)))
            for what, args in variants:
                where = (f"{what} {describe(replace(call, args=args))}"
                         f"{'' if call.training else ' in eval mode'}")
                want = _derivatives(eager_of(module, call), module, call, args, order)
                traced.train(call.training)
                try:
                    got = _derivatives(traced_of(traced, call), module, call, args, order)
                except Exception as e:  # noqa: BLE001 - the trace cannot be differentiated as eager is
                    raise ExportError(f"ganc.export: {name}: its trace cannot be differentiated as eager is "
                                      f"{where}: {str(e).strip().splitlines()[0] if str(e).strip() else e}"
                                      f"{hint}; make the module scriptable") from None
                fresh = [n for n in got.tainted if n not in want.tainted]
                if fresh:
                    raise ExportError(_buffer_refusal(name, path, probe, fresh[0], where))
                compared = _worst(got.outputs, want.outputs)
                if compared is not None and compared[0] > tolerance:
                    raise ExportError(f"ganc.export: {name}: with its parameters changed, its trace computes "
                                      f"otherwise than eager {where}{_by(compared[0])}: the trace froze a "
                                      f"parameter's value at export{_frozen_constants(traced, methods, state)}; "
                                      "use the parameter itself, not a value read from it")
                jitter = None
                for order_name, g, w in (("first", got.first, want.first), ("second", got.second, want.second)):
                    if w is None:
                        continue
                    differences = _differences(g if g is not None else [None] * len(w), w)
                    if differences is None:
                        continue
                    over = [i for i, d in enumerate(differences) if d > gradient_tolerance]
                    floors = None
                    if over and rounding and not any(d == float("inf") for d in differences):
                        if jitter is None:
                            with _jittered(module, rounding[1]):
                                jitter = _derivatives(eager_of(module, call), module, call,
                                                      _jittered_inputs(args, rounding[1]), order)
                        j = jitter.first if order_name == "first" else jitter.second
                        floors = _differences(j, w) if j is not None else None
                        if floors is not None:
                            over = [i for i in over if differences[i] > _ROUNDING_FLOOR * floors[i]]
                    worst = max([worst] + [d for i, d in enumerate(differences) if i not in over])
                    if over:
                        i = max(over, key=differences.__getitem__)
                        floor = (f"; eager's own moves by {floors[i]:.2g} when its inputs and parameters move by "
                                 f"one {rounding[0]} rounding" if floors is not None else "")
                        raise ExportError(_gradient_refusal(name, path, probe, order_name, want.names[i], where,
                                                            differences[i], hint, floor))
                if want.second is not None and got.second is None:
                    raise ExportError(f"ganc.export: {name}: its trace cannot be differentiated twice {where} "
                                      f"({got.failure or 'its first derivative does not depend on its input'}) "
                                      "where eager's can (a phase takes a gradient penalty through it); make "
                                      "the module scriptable")
    return worst


def _buffer_refusal(name, path, probe, buffer, where) -> str:
    blocks = [h for h in probe.grad_blocks if h.path == path or h.path.startswith(path + ".")]
    cause = f" in {blocks[0].construct} ({blocks[0].where})" if blocks else ""
    return (f"ganc.export: {name}: its trace updates buffer {path}.{buffer} in place{cause} with a value that "
            f"carries gradient {where}, where eager's update does not: a trace records the update with "
            "gradients, so the buffer's history would reach into the next step's backward; update it with a "
            ".detach()ed value")


def _gradient_refusal(name, path, probe, order, what, where, difference, hint, floor="") -> str:
    blocks = [h for h in probe.grad_blocks if h.path == path or h.path.startswith(path + ".")]
    cause = (f": {blocks[0].construct} in {blocks[0].path} ({blocks[0].where}): {blocks[0].advice}" if blocks else
             ": the trace differentiates through something eager does not, or not through something eager "
             f"does{hint}; make the module scriptable")
    by = _by(difference)
    if floor and by:
        by = by[:-1] + floor + ")"
    return (f"ganc.export: {name}: its trace's {order} derivative with respect to {what} differs from eager's "
            f"{where}{by}{cause}")
