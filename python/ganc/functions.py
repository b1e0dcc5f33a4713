"""torch.autograd.Function inside a network: exported through its forward's operations, with
autograd deriving the gradient, after checking that the Function's own backward computes that
gradient.

A trace cannot record a Python Function ("Could not export Python function call"). While ganc
traces a network, `derived()` makes `Function.apply` run the Function's forward directly, so the
trace records its operations and autograd differentiates them. That is right exactly when the
Function is a rewrite of the same math for speed or memory (StyleGAN's conv2d_gradfix, fma,
reference bias_act / upfirdn2d) and wrong when its backward is deliberately not the gradient of
its forward (gradient reversal, straight-through estimators). `check()` tells the two apart on
the inputs the probe saw: first derivatives against a random cotangent, and second derivatives
(R1, path length) where the Function's backward is itself differentiable.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
from torch.autograd.function import Function

from .scriptable import ExportError, _location

__all__ = ["Recorder", "derived", "check", "check_all"]

_APPLY = Function.__dict__["apply"]  # the classmethod object, restored after patching


def _apply(cls, *args, **kwargs):
    """torch's own Function.apply for `cls`: a Python classmethod in some versions, a C one
    (a classmethod_descriptor, without __func__) in others; both bind with __get__."""
    return _APPLY.__get__(None, cls)(*args, **kwargs)


def _is_users(cls) -> bool:
    return not cls.__module__.startswith("torch.")


def _where(cls) -> str:
    try:
        fn = inspect.unwrap(cls.forward)
        return _location(inspect.getsourcefile(fn), inspect.getsourcelines(fn)[1])
    except (TypeError, OSError):
        return "<unknown>"


@dataclass
class Applied:
    """The first application of a Function class seen while probing, and the inputs of its
    application with the largest floating-point magnitude (None where that was the first)."""
    cls: type
    args: tuple
    kwargs: dict
    path: str | None
    largest: Applied | None = None
    magnitude: float = 0.0


def _magnitude(args) -> float:
    """The largest finite |value| among the floating-point tensors of `args`. Read past the
    probe's torch-function mode, with TensorBase's own item(): the probe watches conversions to
    Python for the user's, and this one is ganc's."""
    found = 0.0
    with torch._C.DisableTorchFunction():
        for a in args:
            if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel():
                values = a.detach().abs()
                values = values[torch.isfinite(values)]
                if values.numel():
                    found = max(found, torch._C.TensorBase.item(values.max()))
    return found


def _saved(args) -> tuple:
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args)


class Recorder:
    """Records the first call of each user Function class (with its inputs) while probing."""

    def __init__(self):
        self.applied: dict[type, Applied] = {}

    @contextlib.contextmanager
    def recording(self, inside):
        recorder = self

        def apply(cls, *args, **kwargs):
            if _is_users(cls):
                first = recorder.applied.get(cls)
                magnitude = _magnitude(args)
                if first is None:
                    recorder.applied[cls] = Applied(cls, _saved(args), dict(kwargs), inside(),
                                                    magnitude=magnitude)
                elif magnitude > max(first.magnitude, first.largest.magnitude if first.largest else 0.0):
                    first.largest = Applied(cls, _saved(args), dict(kwargs), inside(), magnitude=magnitude)
            return _apply(cls, *args, **kwargs)

        Function.apply = classmethod(apply)
        try:
            yield
        finally:
            Function.apply = _APPLY


class _Dirty(Exception):
    """A Function's forward marked an input dirty (changed it in place)."""


class _Context:
    """What a Function's forward may use of its ctx, for a forward run outside Function.apply."""

    def __init__(self, args):
        self.needs_input_grad = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        self.saved_tensors = ()
        self.non_differentiable = set()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        raise _Dirty()

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable.update(id(t) for t in tensors)

    def set_materialize_grads(self, value):
        pass


def _forward_of(cls, *args, **kwargs):
    """The Function's forward run as ordinary operations (autograd records them)."""
    ctx = _Context(args)
    if cls.setup_context is not Function.setup_context:
        # The forward(*args) + setup_context(ctx, inputs, output) style: no ctx in forward.
        out = cls.forward(*args, **kwargs)
        cls.setup_context(ctx, args, out)
    else:
        out = cls.forward(ctx, *args, **kwargs)
    if ctx.non_differentiable:
        if isinstance(out, torch.Tensor):
            return out.detach() if id(out) in ctx.non_differentiable else out
        return type(out)(o.detach() if isinstance(o, torch.Tensor) and id(o) in ctx.non_differentiable else o
                         for o in out)
    return out


@contextlib.contextmanager
def derived():
    """Within the block, user Functions run their forward's operations (for tracing)."""
    def apply(cls, *args, **kwargs):
        if not _is_users(cls):
            return _apply(cls, *args, **kwargs)
        return _forward_of(cls, *args, **kwargs)

    Function.apply = classmethod(apply)
    try:
        yield
    finally:
        Function.apply = _APPLY


def _outputs(out):
    return [o for o in (out if isinstance(out, (tuple, list)) else [out])
            if isinstance(o, torch.Tensor) and o.requires_grad]


def _grads(run, applied: Applied, second: bool):
    """First derivatives of the Function's outputs against fixed random cotangents, for every
    differentiable floating-point input, and (when `second`) the derivatives of those against
    fixed random weights: (first, second or None)."""
    inputs = tuple(a.detach().clone().requires_grad_(a.is_floating_point() or a.is_complex())
                   if isinstance(a, torch.Tensor) else a for a in applied.args)
    wrt = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
    outs = _outputs(run(applied.cls, *inputs, **applied.kwargs))
    gen = torch.Generator().manual_seed(0)
    cot = [torch.randn(o.shape, generator=gen).to(o) for o in outs]
    first = torch.autograd.grad(outs, wrt, cot, create_graph=second, allow_unused=True)
    first = [torch.zeros_like(w) if g is None else g for g, w in zip(first, wrt)]
    if not second:
        return [g.detach() for g in first], None
    weights = [torch.randn(g.shape, generator=gen).to(g) for g in first]
    terms = [(g * w).sum() for g, w in zip(first, weights) if g.requires_grad]
    then = torch.autograd.grad([sum(terms)], wrt, allow_unused=True) if terms else [None] * len(wrt)
    return ([g.detach() for g in first],
            [torch.zeros_like(w) if g is None else g.detach() for g, w in zip(then, wrt)])


def _differ(a, b) -> float:
    scale = max(b.abs().max().item() if b.numel() else 0.0, 1e-12)
    return (a - b).abs().max().item() / scale if b.numel() else 0.0


def check_all(applied) -> list:
    """check() for each Function applied, one line per Function definition (a factory such as
    conv2d_gradfix's makes one class per configuration) listing where it ran."""
    found = {}
    for a in applied:
        key = (a.cls.__qualname__, _where(a.cls), check(a))
        found.setdefault(key, [])
        if a.path and a.path not in found[key]:
            found[key].append(a.path)
    lines = []
    for (name, where, checked), paths in found.items():
        inside = ""
        if paths:
            more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
            inside = f" in {', '.join(paths[:3])}{more}"
        lines.append(f"torch.autograd.Function {name} ({where}){inside}: {checked}")
    return lines


# The scales at which a Function's backward is compared with its forward's gradient, applied
# to the inputs the probe saw: a straight-through estimator that clamps (at +-3, +-20, +-1e4)
# agrees with its forward's gradient only on inputs below its bounds, so the ladder climbs to
# magnitudes far past any activation a phase produces, until the inputs overflow.
_SCALES = (1.0, 10.0, 1e2, 1e3, 1e4, 1e6, 1e9, 1e12)


def _cases(applied: Applied):
    """(inputs, scale, what they are) to compare at: the first call's inputs up the ladder, then
    the largest inputs the phases gave the Function, as they were and ten times over."""
    def scaled(case: Applied, scale: float) -> Applied | None:
        args = tuple(a * scale if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in case.args)
        if scale != 1.0 and not all(bool(torch.isfinite(a).all()) for a in args
                                    if isinstance(a, torch.Tensor) and a.is_floating_point()):
            return None  # past the dtype's range: the ladder ends here
        return case if scale == 1.0 else Applied(cls=case.cls, args=args, kwargs=case.kwargs, path=case.path)
    for case, scales in ((applied, _SCALES), (applied.largest, (1.0, 10.0))):
        if case is None:
            continue
        for scale in scales:
            found = scaled(case, scale)
            if found is None:
                break
            at = "" if scale == 1.0 else f"{scale:g} times "
            what = f" on inputs {at}those the probe saw" if scale != 1.0 else ""
            if case is not applied:
                what = f" on {at}the largest inputs the phases gave it (|x| up to {case.magnitude:.3g})"
            yield found, scale, what


def check(applied: Applied, tolerance: float = 1e-4) -> str:
    """Compares the Function's own backward with the gradient autograd derives from its
    forward; returns what was checked, raises ExportError naming the Function if they differ."""
    cls = applied.cls
    name = f"torch.autograd.Function {cls.__qualname__} ({_where(cls)})"
    where = f" in {applied.path}" if applied.path else ""

    def own(c, *a, **k):
        return _apply(c, *a, **k)

    try:
        with torch.no_grad():
            _forward_of(cls, *(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in applied.args),
                        **applied.kwargs)
    except _Dirty:
        raise ExportError(f"ganc.export: {name}{where}: its forward changes an input in place (ctx.mark_dirty): "
                          "ganc derives a Function's gradient from its forward's operations, and a trace "
                          "cannot record a Function that changes its input; return a new tensor instead") from None

    checked = ""
    for case, scale, at in _cases(applied):
        # Past ten times the probe's inputs, the first derivatives only, to 1%: a straight-through
        # estimator is off by the whole gradient there, while a forward's second derivative
        # (exp / (1 + exp) differentiated again) loses every digit to cancellation.
        far = scale > 10.0
        with torch.enable_grad():
            try:
                expected = _grads(own, case, second=not far)
                if not far:
                    checked = "its backward and double backward"
            except RuntimeError:  # its backward is not differentiable: first order only
                expected = _grads(own, case, second=False)
                checked = "its backward (not differentiable itself: no double backward to compare)"
            got = _grads(_forward_of, case, second=expected[1] is not None)
        if not all(bool(torch.isfinite(e).all()) for e in expected[0] + (expected[1] or [])):
            continue  # its own gradients overflow at this scale: nothing to compare
        if scale != 1.0 and not all(bool(torch.isfinite(g).all()) for g in got[0] + (got[1] or [])):
            continue  # the forward's derivative overflows where its own backward does not (exp)
        for order, got_, expected_ in (("first", got[0], expected[0]), ("second", got[1], expected[1])):
            for g, e in zip(got_ or [], expected_ or []):
                err = _differ(g, e)
                if not err <= (1e-2 if far else tolerance):
                    raise ExportError(f"ganc.export: {name}{where}: its backward is not the gradient of its "
                                      f"forward (the {order} derivatives differ by {err:.3g} relative{at}): "
                                      "ganc derives a Function's gradient from its forward, so only Functions "
                                      "that compute their forward's gradient export; write this one as a "
                                      "TORCH_LIBRARY operator with its autograd kernel (--op-library) or as "
                                      "ordinary operations")
    return f"gradient derived from its forward; matches {checked}"
