"""How a phase's calls reach a network that is traced (step 3 of ganc.hybrid): tensors by position
or keyword, and constants (bools, ints, floats, strings, None) by position or keyword, as the
user's code passes them (`G.synthesis(ws, update_emas=True)`, `block(x, noise_mode='const')`).

A trace records tensors only. Each distinct set of constants a method is called with is traced as
a variant of its own (as distinct shapes are, where a trace fixed a shape), and the method
becomes a scripted dispatch with the method's own parameter names that picks the variant by the
constants' values, the inputs' shapes and train/eval mode. Calls that pass tensors by position
only keep the plain trace."""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from .probe import Call, where_of
from .scriptable import ExportError

__all__ = ["Form", "forms", "describe", "eager_of", "traced_of", "define_dispatch"]

_CONSTANTS = (bool, int, float, str, type(None))


@dataclass
class Form:
    """One recorded call as the trace sees it: the names of its tensor parameters (in the
    signature's order) and the binding that puts tensors back with its constants."""
    names: tuple
    bound: inspect.BoundArguments

    def arguments(self, tensors):
        """(args, kwargs) for the method's function (self first) with `tensors` in place."""
        by_name = dict(zip(self.names, tensors))
        values = {}
        for name, value in self.bound.arguments.items():
            kind = self.bound.signature.parameters[name].kind
            if kind == inspect.Parameter.VAR_KEYWORD:
                values[name] = {k: by_name.get(k, v) for k, v in value.items()}
            else:
                values[name] = by_name.get(name, value)
        bound = inspect.BoundArguments(self.bound.signature, values)
        return bound.args, bound.kwargs


def _flat(bound: inspect.BoundArguments) -> dict:
    """name -> value of every argument passed, a **kwargs parameter's entries by their own names."""
    out = {}
    for name, value in list(bound.arguments.items())[1:]:  # self
        kind = bound.signature.parameters[name].kind
        if kind == inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind == inspect.Parameter.VAR_POSITIONAL:
            out.update({f"{name}_{i}": v for i, v in enumerate(value)})
        else:
            out[name] = value
    return out


def forms(module, path: str, calls: list) -> list:
    """`calls` as the trace takes them: where every call passes tensors by position only, the
    calls themselves; else each as a Call whose `args` are its tensors (by parameter name, in
    the signature's order), whose `kwargs` are its constants, with its Form. ExportError naming
    the parameter where an argument is neither, or where calls disagree on which are tensors."""
    if all(not c.kwargs and all(isinstance(a, torch.Tensor) for a in c.args) for c in calls):
        return calls
    name = f"{path} ({type(module).__name__}, {where_of(module)})"
    out, kinds = [], {}
    for call in calls:
        function = getattr(type(module), call.method)
        signature = inspect.signature(function)
        try:
            bound = signature.bind(module, *call.args, **call.kwargs)
        except TypeError as e:
            raise ExportError(f"ganc.export: {name}: its {call.method} is called with arguments its signature does "
                              f"not take ({e})") from None
        if any(signature.parameters[p].kind == inspect.Parameter.VAR_POSITIONAL and v
               and not all(isinstance(a, torch.Tensor) for a in v) for p, v in bound.arguments.items()):
            raise ExportError(f"ganc.export: {name} does not script and its {call.method} takes *args with "
                              "non-tensor values: a traced network takes constants by name; pass them by keyword")
        flat = _flat(bound)
        for arg, value in flat.items():
            if not isinstance(value, (torch.Tensor,) + _CONSTANTS):
                raise ExportError(f"ganc.export: {name} does not script and its {call.method} is called with "
                                  f"{arg}={value!r} ({type(value).__name__}): a traced network takes tensors and "
                                  "constants (bool, int, float, str, None); pass the others as tensors, or make "
                                  "the module scriptable")
            kind = "tensor" if isinstance(value, torch.Tensor) else "constant"
            seen = kinds.setdefault((call.method, arg), (kind, call))
            if seen[0] != kind:
                raise ExportError(f"ganc.export: {name} does not script and its {call.method}'s {arg} is a "
                                  f"{seen[0]} in {_where(seen[1])} ({describe(seen[1])}) and a {kind} in "
                                  f"{_where(call)} ({describe(call)}): a traced method takes a tensor or a "
                                  "constant at each parameter; pass the same kind everywhere")
        tensors = tuple(n for n, v in flat.items() if isinstance(v, torch.Tensor))
        constants = {n: v for n, v in flat.items() if not isinstance(v, torch.Tensor)}
        out.append(Call(call.method, tuple(flat[n] for n in tensors), constants, call.training, call.phase,
                        call.grad, call.twice, Form(tensors, bound)))
    for call in out:
        first = next(c for c in out if c.method == call.method)
        if call.form.names != first.form.names:
            raise ExportError(f"ganc.export: {name} does not script and its {call.method} takes tensors "
                              f"({', '.join(first.form.names)}) from {_where(first)} and ({', '.join(call.form.names)}) "
                              f"from {_where(call)}: a traced method takes one set of tensors; pass the same "
                              "tensors everywhere, or make the module scriptable")
    return out


def _where(call) -> str:
    return f"phase {call.phase!r}" if call.phase != "sample" else "the sample grid"


def describe(call) -> str:
    """`forward([8, 32], update_emas=True)`: a call's shapes and constants."""
    parts = [str(list(a.shape)) if isinstance(a, torch.Tensor) else repr(a) for a in call.args]
    parts += [f"{k}={v!r}" for k, v in call.kwargs.items()]
    return f"{call.method}({', '.join(parts)})"


def eager_of(module, call):
    """The module's method as the call made it, taking the call's tensors positionally."""
    if call.form is None:
        return getattr(module, call.method)
    function = getattr(type(module), call.method)

    def run(*tensors):
        args, kwargs = call.form.arguments(tensors)
        return function(*args, **kwargs)
    return run


def traced_of(traced, call):
    """The traced module's method as the call made it, taking the call's tensors positionally."""
    method = getattr(traced, call.method)
    if call.form is None:
        return method

    def run(*tensors):
        return method(**dict(zip(call.form.names, tensors)), **call.kwargs)
    return run


def _annotation(values) -> str:
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        base = "Tensor"  # None wherever it is passed: a tensor argument left out
    elif kinds == {bool}:
        base = "bool"
    elif kinds <= {int, float} and bool not in kinds:
        base = "float" if float in kinds else "int"
    elif len(kinds) == 1:
        base = next(iter(kinds)).__name__
    else:
        raise ExportError(f"ganc.export: a constant is passed as {' and '.join(sorted(k.__name__ for k in kinds))}: "
                          "pass one type")
    return f"Optional[{base}]" if None in values or base == "Tensor" else base


def _test(name: str, value) -> str:
    if value is None:
        return f"{name} is None"
    if isinstance(value, bool):
        return name if value else f"not {name}"
    return f"{name} == {value!r}"


def define_dispatch(traced, method: str, mine: list, with_shapes: bool) -> None:
    """`method` as a scripted dispatch to the variants `mine` ([(trace name, call)]) by their
    constants and train/eval mode, and (`with_shapes`) their inputs' shapes: ganc's phases call
    a network at fixed shapes and constants, so one of them always matches. Its parameters are
    the Python method's (tensors and the constants any call passes), in their order, with their
    defaults where a call may leave them out."""
    first = mine[0][1]
    constants = {}
    for _, call in mine:
        for name, value in call.kwargs.items():
            constants.setdefault(name, []).append(value)
    if first.form is None:
        params = [(f"x{k}", "Tensor", None) for k in range(len(first.args))]
        tensor_names = [p[0] for p in params]
    else:
        tensor_names = list(first.form.names)
        signature = first.form.bound.signature
        order = list(signature.parameters)
        position = {n: (order.index(n) if n in order else len(order)) for n in tensor_names + list(constants)}
        params = []
        for name in sorted(position, key=position.get):
            if name in constants:
                values = constants[name]
                default = _default_of(first, name)
                passed = len(values) == len(mine)
                if name in signature.parameters and signature.parameters[name].default is not inspect.Parameter.empty \
                        and isinstance(signature.parameters[name].default, _CONSTANTS):
                    params.append((name, _annotation(values + [default]), repr(default)))
                elif not passed:
                    params.append((name, _annotation(values + [None]), "None"))
                else:
                    params.append((name, _annotation(values), None))
            else:
                params.append((name, "Tensor", None))
    # A parameter without a default after one with a default: the defaults before it go.
    last_required = max([i for i, p in enumerate(params) if p[2] is None], default=-1)
    params = [(n, a, None if i < last_required else d) for i, (n, a, d) in enumerate(params)]
    body = []
    for trace_name, call in mine:
        tests = ["self.training" if call.training else "not self.training"]
        for name in constants:
            tests.append(_test(name, call.kwargs.get(name, _default_of(call, name))))
        if with_shapes:
            for name, a in zip(tensor_names, call.args):
                tests += [f"{name}.dim() == {a.dim()}"] + [f"{name}.size({d}) == {n}" for d, n in enumerate(a.shape)]
        body.append(f"    if {' and '.join(tests)}:\n        return self.{trace_name}({', '.join(tensor_names)})")
    shapes = "; ".join(describe(c) + ("" if c.training else " in eval mode") for _, c in mine)
    body.append(f"    raise RuntimeError({('ganc: this network was traced at ' + shapes)!r})")
    header = ", ".join(f"{n}: {a}" + (f" = {d}" if d is not None else "") for n, a, d in params)
    traced.define(f"def {method}(self, {header}):\n" + "\n".join(body) + "\n")


def _default_of(call, name):
    """The value a call that leaves constant `name` out runs with: its Python default, else None."""
    parameter = call.form.bound.signature.parameters.get(name) if call.form is not None else None
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return None
    return parameter.default
