"""Hooks that change gradients from outside a network's code: refused at export, in one line
naming the hook and the file:line where it was written.

An archive holds what the phases' code computes; ganc's runtime differentiates that. A hook
registered on a parameter (`weight.register_hook(lambda g: g * 0.1)` in `__init__`,
`register_post_accumulate_grad_hook`) or on every module at once
(`torch.nn.modules.module.register_module_forward_hook` and its kin) is not part of that code:
the archive would train without it, with gradients eager PyTorch never computes, and say
nothing. Hooks on a network's own modules are the tracer's and scripter's business
(`tracing._check_hooks`, TorchScript's own refusal of backward hooks).
"""
from __future__ import annotations

import functools
import inspect

import torch
from torch.nn.modules import module as _module

from .scriptable import ExportError, _location

__all__ = ["refuse_gradient_hooks", "refuse_shared_parameters"]

# The global module hooks torch runs around every module's forward and backward
# (torch.nn.modules.module.register_module_*_hook), by what registers them.
_GLOBAL = (("register_module_forward_pre_hook", "_global_forward_pre_hooks"),
           ("register_module_forward_hook", "_global_forward_hooks"),
           ("register_module_full_backward_pre_hook", "_global_backward_pre_hooks"),
           ("register_module_full_backward_hook", "_global_backward_hooks"))

# The hooks a tensor keeps, by what registers them.
_TENSOR = (("register_hook", "_backward_hooks"),
           ("register_post_accumulate_grad_hook", "_post_accumulate_grad_hooks"))


def _definition(hook) -> str:
    """`name (file:line)` of the function a hook runs: a lambda's line is where it was written."""
    target = hook
    while isinstance(target, functools.partial):
        target = target.func
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    name = getattr(target, "__qualname__", type(hook).__name__)
    if code is not None:
        return f"{name}, {_location(code.co_filename, code.co_firstlineno)}"
    try:
        source = inspect.unwrap(type(target).__call__)
        return f"{type(target).__qualname__}, {_location(inspect.getsourcefile(source), inspect.getsourcelines(source)[1])}"
    except (TypeError, OSError):
        return f"{name}, <unknown>"


def _hooks(tensor: torch.Tensor, attribute: str) -> list:
    found = getattr(tensor, attribute, None)
    return list(found.values()) if found else []


def refuse_gradient_hooks(gan: torch.nn.Module) -> None:
    """Raises ExportError naming the first hook on a parameter or buffer of `gan`, or the first
    global module hook, that an archive of `gan` would leave out."""
    for registers, attribute in _GLOBAL:
        for hook in getattr(_module, attribute, {}).values():
            raise ExportError(f"ganc.export: a global module hook ({_definition(hook)}, registered with "
                              f"torch.nn.modules.module.{registers}) runs around every module's "
                              f"{'backward' if 'backward' in registers else 'forward'} in eager PyTorch and "
                              "is not part of the exported code, so the archive would train without it; "
                              "remove it before ganc.export, or call what it does from the networks' forward")
    named = [("parameter", n, t) for n, t in gan.named_parameters(remove_duplicate=False)]
    named += [("buffer", n, t) for n, t in gan.named_buffers(remove_duplicate=False)]
    for kind, name, tensor in named:
        for registers, attribute in _TENSOR:
            for hook in _hooks(tensor, attribute):
                raise ExportError(f"ganc.export: {kind} {name!r} has a gradient hook ({_definition(hook)}, "
                                  f"registered with {registers}) that eager PyTorch runs on its gradient and "
                                  "the exported code does not hold, so the archive would train with another "
                                  "gradient; write what it does into the loss (scale the term it belongs to) "
                                  "or into forward as a torch.autograd.Function, and remove the hook")


def refuse_shared_parameters(gan: torch.nn.Module) -> None:
    """Raises ExportError naming the first parameter or buffer `gan` reaches under two names (a
    module shared by two networks, as UNIT's encoders share a block, or a tied weight): the
    archive, the buckets and the optimizers would each see it twice, reducing and stepping it
    twice, and its training would part from eager DDP's without a word."""
    seen: dict[int, str] = {}
    named = [("parameter", n, t) for n, t in gan.named_parameters(remove_duplicate=False)]
    named += [("buffer", n, t) for n, t in gan.named_buffers(remove_duplicate=False)]
    for kind, name, tensor in named:
        first = seen.setdefault(id(tensor), name)
        if first != name:
            module = name.rsplit(".", 1)[0]
            raise ExportError(f"ganc.export: {kind} {first!r} is reachable as {name!r} too (a module or tensor "
                              f"shared by two networks, here {module!r}): ganc exports each parameter under one "
                              "name and does not train shared ones yet; give each network its own copy, or keep "
                              "the shared part in one network and call it from the other's phase")
