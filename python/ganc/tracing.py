"""Tracing one network that does not script, at the calls the probe recorded, and checking the
trace before the hybrid export stitches it in (step 3 of ganc.hybrid): traced twice under
different Python random states (the graphs must be the same) and run against eager on every
recorded call and on a second input of the same shapes (the outputs must agree), then by its
derivatives (ganc.trace_derivatives)."""
from __future__ import annotations

import inspect
import random
import re
import warnings
from dataclasses import replace

import torch
import torch.nn as nn

from . import draws, functions
from .probe import Probe, _clone, _np, raised_at, where_of
from .scriptable import ExportError, _location
from .trace_calls import define_dispatch, describe, eager_of, forms, traced_of
from .trace_derivatives import _EXACT, _by, _second_input, check_derivatives, rng_kept

__all__ = ["rng_kept", "trace_module"]


# -- tracing one module and checking the trace --------------------------------------------------

def _seeded(python_seed: int, torch_seed: int = 0):
    random.seed(python_seed)
    if _np is not None:
        _np.random.seed(python_seed)
    torch.manual_seed(torch_seed)



def _failure(error: BaseException) -> str:
    """An exception in one line, with the user's file:line it was raised at."""
    at = raised_at(error)
    where = f" ({at})" if at else ""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}{where}"


def _check_arguments(module, path, calls):
    """A traced method takes one signature: refuses calls by position with different numbers
    of tensors, naming them (calls with constants or keywords are checked by trace_calls.forms)."""
    for call in calls:
        first = next(c for c in calls if c.method == call.method)
        if len(call.args) != len(first.args):
            def where(c):
                return f"phase {c.phase!r}" if c.phase != "sample" else "the sample grid"
            def tensors(n):
                return f"{n} tensor{'' if n == 1 else 's'}"
            raise ExportError(f"ganc.export: {path} ({type(module).__name__}, {where_of(module)}) does not script "
                              f"and its {call.method} is called with {tensors(len(first.args))} by "
                              f"{where(first)} ({describe(first)}) and {len(call.args)} by {where(call)} "
                              f"({describe(call)}): a traced method takes one signature; pass the same "
                              "tensors everywhere (a dummy where one is unused), or make the module scriptable")


_HOOKS = (("forward hook", "_forward_hooks"), ("forward pre-hook", "_forward_pre_hooks"),
          ("backward hook", "_backward_hooks"), ("backward pre-hook", "_backward_pre_hooks"))


def _hook_name(hook) -> str:
    target = getattr(hook, "__func__", hook)
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        target = type(hook)
    return getattr(target, "__qualname__", type(hook).__name__), target


def _check_hooks(module, path, why):
    """A hook on a traced network (or a module inside it) is refused: the trace runs the
    network's forward without its own hooks and bakes in once what its modules' hooks did.
    PyTorch's own hooks (weight norm) are what they were: they compute in tensors."""
    for sub_path, sub in module.named_modules():
        for kind, attribute in _HOOKS:
            for hook in getattr(sub, attribute, {}).values():
                name, target = _hook_name(hook)
                if getattr(target, "__module__", "").startswith("torch."):
                    continue
                try:
                    where = _location(inspect.getsourcefile(target), inspect.getsourcelines(target)[1])
                except (TypeError, OSError):
                    where = "<unknown>"
                full = f"{path}.{sub_path}" if sub_path else path
                raise ExportError(f"ganc.export: {full} ({type(sub).__name__}): a {kind} ({name}, {where}) on a "
                                  f"module inside a network that does not script ({why}): a trace does not run "
                                  "hooks as hooks; call what the hook does from forward, or make the network "
                                  "scriptable")


def _in_mode(module, call):
    """`module`'s method as `call` made it, run in the call's train or eval mode (a trace records
    the mode's code path), taking the call's tensors."""
    method = eager_of(module, call)

    def run(*args):
        modes = {m: m.training for m in module.modules()}
        module.train(call.training)
        try:
            return method(*args)
        finally:
            for m, mode in modes.items():
                m.training = mode
    return run


def _variant(call):
    return call.method, tuple(sorted((k, repr(v)) for k, v in call.kwargs.items()))


def _trace(module, calls, python_seed, specialise):
    """One trace of `module`: each method at its first call with each set of constants, or
    (`specialise`) one traced method per call, `_ganc_<method>_<i>`, and the method a scripted
    dispatch to them. Returns the trace, the tracer's warnings and the traced methods' names."""
    picked = calls if specialise else [c for i, c in enumerate(calls)
                                         if all(_variant(c) != _variant(d) for d in calls[:i])]
    dispatched = specialise or any(c.form is not None for c in calls)
    inputs = {}
    for i, call in enumerate(picked):
        name = f"_ganc_{call.method}_{i}" if dispatched else call.method
        module.__dict__[name] = _in_mode(module, call)
        inputs[name] = call.args
    try:
        with rng_kept(), warnings.catch_warnings(record=True) as caught, functions.derived(), \
                draws.substituted() as drawn:
            warnings.simplefilter("always")
            # Seeded apart twice: what a trace froze of a draw differs between the two traces.
            _seeded(python_seed, python_seed)
            traced = torch.jit.trace_module(module, inputs, check_trace=False, strict=False)
        draws.as_random_ops(traced, drawn)
        _follow_input_device(traced)
    finally:
        for name in inputs:
            module.__dict__.pop(name, None)
    tracer = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    if dispatched:
        for method in dict.fromkeys(c.method for c in picked):
            mine = [(name, c) for name, c in zip(inputs, picked) if c.method == method]
            define_dispatch(traced, method, mine, with_shapes=specialise)
    return traced, tracer, list(inputs), drawn


# Operations that make a tensor on the device they are given (`device=x.device`, which a trace
# records as the constant device it ran on).
_FACTORIES = {"aten::" + op for op in (
    "randn", "rand", "randint", "randperm", "normal", "zeros", "ones", "empty", "full", "arange", "linspace",
    "logspace", "eye", "tensor", "scalar_tensor", "as_tensor", "empty_strided", "bernoulli")}


def _follow_input_device(traced):
    """In every traced graph, a constant device given to a factory (torch.randn(...,
    device=x.device) in StyleGAN's noise inputs) becomes the device of the method's first
    tensor input: the export runs on the CPU and the network trains on any device."""
    for module in traced.modules():
        for name in module._c._method_names():
            graph = module._c._get_method(name).graph
            first = next((v for v in graph.inputs() if v.type().kind() == "TensorType"), None)
            if first is None:
                continue
            device = None
            for node in list(graph.nodes()):
                if node.kind() != "prim::Constant" or node.output().type().kind() != "DeviceObjType":
                    continue
                for use in list(node.output().uses()):
                    if use.user.kind() not in _FACTORIES:
                        continue
                    if device is None:
                        device = graph.create("prim::device", [first])
                        device.output().setType(torch._C.DeviceObjType.get())
                        device.insertBefore(next(iter(graph.nodes())))
                    use.user.replaceInput(use.offset, device.output())


def _graphs(traced, methods):
    """The traced methods' graphs, without the type-name counters that differ between traces."""
    return [re.sub(r"___torch_mangle_\d+\.", "", str(getattr(traced, m).inlined_graph)) for m in methods]


def _difference(a, b) -> float:
    """The largest difference between two outputs, relative to the largest magnitude of each
    tensor of `b`: inf where their structure, shapes, dtypes or exact values (integers, NaNs)
    differ."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return float("inf")
        if not a.is_floating_point():
            return 0.0 if torch.equal(a, b) else float("inf")
        if not b.numel():
            return 0.0
        scale = max(b.abs().max().item(), 1e-6)
        worst = (a - b).abs().max().item()
        return worst / scale if worst == worst else float("inf")  # NaN: not the same
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return max([_difference(x, y) for x, y in zip(a, b)], default=0.0) if len(a) == len(b) else float("inf")
    if isinstance(a, dict) and isinstance(b, dict):
        return max([_difference(a[k], b[k]) for k in a], default=0.0) if a.keys() == b.keys() else float("inf")
    return 0.0 if a == b else float("inf")


# A trace agrees with eager to this, relative, in float32 and float64.
_REDUCED = {"Half": torch.float16, "BFloat16": torch.bfloat16}


def _rounding(traced, methods):
    """The lowest floating precision the trace computes in, where lower than float32: (its
    name, its rounding step). Such a trace can differ from eager by a rounding where the
    tracer records Python arithmetic on sizes as tensor operations (StyleGAN2's `1 /
    np.sqrt(in_channels * kh * kw)` before its float16 convolutions: eager multiplies by a
    float64 number, the trace divides by a 0-dim float64 tensor). (None, 0.0) where it
    computes in float32 or wider only."""
    kinds = (value.type() for method in methods
             for node in getattr(traced, method).inlined_graph.nodes() for value in node.outputs())
    found = {_REDUCED[kind.scalarType()] for kind in kinds
             if isinstance(kind, torch._C.TensorType) and kind.scalarType() in _REDUCED}
    if not found:
        return None, 0.0
    dtype = max(found, key=lambda d: torch.finfo(d).eps)
    return str(dtype).removeprefix("torch."), torch.finfo(dtype).eps


def _run(fn, args, training, module, seed):
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    module.train(training)
    try:
        with rng_kept(), torch.no_grad():
            torch.manual_seed(seed)
            return fn(*_clone(args))
    finally:
        with torch.no_grad():
            for k, v in module.state_dict().items():
                v.copy_(state[k])


def _agreement(module, traced, call, args) -> float:
    """How far the trace's outputs are from eager's on `args` (same torch seed, same state):
    _difference's, inf where the trace fails."""
    want = _run(eager_of(module, call), args, call.training, module, seed=7)
    try:
        traced.train(call.training)
        got = _run(traced_of(traced, call), args, call.training, module, seed=7)
    except Exception:  # noqa: BLE001 - a trace that fails on other shapes fixed one of them
        return float("inf")
    return _difference(got, want)


def trace_module(module: nn.Module, path: str, probe: Probe, why: str):
    """`module` traced at the calls `probe` recorded, after checking that the trace computes
    what eager does; ExportError naming the module, file:line and construct otherwise.

    One trace serves every call where it can; where a trace fixed a shape (a Python int taken
    from an input's size), each call is traced on its own and a scripted dispatch picks the
    trace by the inputs' shapes and the train/eval mode."""
    name = f"{path} ({type(module).__name__}, {where_of(module)})"
    with draws.substituted():  # the eager runs that check the trace draw what it draws
        return _traced_and_checked(module, path, probe, why, name)


def _traced_and_checked(module, path, probe, why, name):
    for hazard in (h for h in probe.hazards_in(path) if not h.substitute):
        advice = hazard.advice or ("a trace would freeze it, the same every step; draw random numbers with torch "
                                   "(torch.rand, torch.randn) and keep tensor values in tensors (torch.where), or "
                                   "make the module scriptable")
        raise ExportError(f"ganc.export: {hazard.path} ({hazard.where}): {hazard.construct} in a module that "
                          f"does not script ({why}): {advice}")
    calls = forms(module, path, probe.calls[path])
    _check_arguments(module, path, calls)
    _check_hooks(module, path, why)
    training = module.training
    specialised = False
    try:
        traced, tracer, methods, drawn = _trace(module, calls, 1, specialise=False)
    except (ExportError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - the network's own code failed under the tracer
        raise ExportError(f"ganc.export: {name}: tracing its {calls[0].method} at {describe(calls[0])} failed: "
                          f"{_failure(e)}; it runs eagerly at the probe, so this is what tracing "
                          "changes (a child's attribute, a Python value of a tensor)") from e
    precision, step = _rounding(traced, methods)
    tolerance = 4 * step if precision else _EXACT  # four of its roundings
    if not all([_agreement(module, traced, call, call.args) <= tolerance for call in calls[1:]]):
        specialised = True
        traced, tracer, methods, drawn = _trace(module, calls, 1, specialise=True)
    again, _, _, _ = _trace(module, calls, 2, specialise=specialised)
    for draw in drawn:
        if not draw.found:
            raise ExportError(f"ganc.export: {name}: {draw.describe()} does not reach a tensor as drawn "
                              "(Tensor(...), torch.from_numpy, torch.tensor of the whole array): a trace "
                              "would freeze it, the same every step; draw it with torch")
        if draw.found > 1:  # each conversion would draw anew, where eager's share one draw
            raise ExportError(f"ganc.export: {name}: {draw.describe()} becomes a tensor {draw.found} times: "
                              "convert it once and use that tensor")
    module.train(training)
    traced.train(training)
    hint = ""
    if tracer:
        w = tracer[0]
        hint = f"; the tracer warned at {_location(w.filename, w.lineno)}: {str(w.message).splitlines()[0]}"
    if _graphs(traced, methods) != _graphs(again, methods):
        raise ExportError(f"ganc.export: {name}: traced under two Python random states it records two "
                          f"different graphs: Python randomness would be frozen by the trace{hint}")
    worst = 0.0
    for call in calls:
        checks = [("at", call.args)] if specialised or call is calls[0] else []
        if any(isinstance(a, torch.Tensor) and a.numel() > 1 for a in call.args):
            checks.append(("with a second input of", _second_input(call.args)))
        for what, args in checks:
            difference = _agreement(module, traced, call, args)
            worst = max(worst, difference)
            if difference > tolerance:
                mode = "" if call.training else " in eval mode"
                raise ExportError(f"ganc.export: {name}: its trace computes otherwise than eager {what} "
                                  f"{describe(replace(call, args=args))}{mode}"
                                  f"{_by(difference)}: the trace fixed a value of its example input{hint}; "
                                  "make the module scriptable or compute the value with tensor operations")
    check_derivatives(module, traced, calls, methods, name, path, probe, tolerance, hint,
                      (precision, step) if precision else None)
    traced.train(training)
    shapes = ", ".join(describe(c) + ("" if c.training else " in eval mode") for c in calls)
    how = "one trace per call" if specialised else "traced"
    rounding = ""
    if worst > _EXACT:
        rounding = (f"; computes in {precision}, agreeing with eager to {worst:.2g} relative ({precision} "
                    f"rounds at {step:.2g}), not bit for bit")
    kinds = sorted({f"numpy.random.{d.function}() ({d.where})" for d in drawn})
    random_ops = f"; {', '.join(kinds)} drawn by torch.{'/'.join(sorted({d.factory for d in drawn}))} from " \
                 "ganc's random stream" if kinds else ""
    return traced, f"{how} at {shapes}: {why}{rounding}{random_ops}"
