"""Hybrid export: the phase methods scripted, every network that does not script traced alone
at the calls the phases make, and the traces stitched into the scripted GAN.

Scripting keeps what a phase needs of TorchScript (`torch.autograd.grad(create_graph=True)` for
R1, path length and WGAN-GP; branches on flags); tracing takes network code as people write it
(`**kwargs` forwards, decorators, numpy constants, autograd Functions). The steps:

1. Probe: every phase runs once eagerly at the spec's shapes (and the sample grid's call, in
   eval mode). Hooks record each submodule's calls from outside it (the tensors a scripted
   caller will pass), every torch.autograd.Function applied, and what a trace would freeze:
   Python randomness (`random`, `numpy.random`) and tensor values turned into Python values
   (`if tensor:`, `.item()`, `float(tensor)`) inside a module.
2. Resolve, top down: a submodule that scripts stays as it is. One that does not has its
   children resolved first (so as much as possible stays scripted), then is scripted again;
   if it still fails it is traced at its recorded calls (all of its methods that scripted code
   calls), or, when no scripted code calls it (a container such as StyleGAN's `G`, whose phases
   call `G.mapping` and `G.synthesis`), it becomes a plain container of the same parameters,
   buffers and children. State-dict names never change.
3. Check each trace before it is used: traced twice under different Python RNG states (the
   graphs must be the same) and run against eager on every recorded call and on a second input
   of the same shapes (the outputs must agree). Python randomness or a tensor value read into
   Python inside a traced module is refused outright, naming the module, the file:line and the
   construct.

A torch.autograd.Function inside a traced network is traced through its forward's operations,
so autograd derives its gradient; `functions.check` first compares the Function's own backward
(and double backward) with the derived one on the inputs the probe saw.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn

from . import augment
from .probe import _STDLIB_DIR, _TORCH_DIR, Probe
from .scriptable import ExportError, _location, python_call
from .tracing import trace_module

__all__ = ["Resolver", "Decision", "script_error", "script_failure"]


def script_failure(error: BaseException) -> str:
    """TorchScript's error in one line: its first line and the user's file:line it names."""
    text = str(error).strip()
    first = text.splitlines()[0].rstrip(":") if text else type(error).__name__
    found = re.findall(r'File "([^"]+)", line (\d+)', text)
    found = [(f, int(n)) for f, n in found if not (f.startswith(_TORCH_DIR) or f.startswith(_STDLIB_DIR))] or \
            [(f, int(n)) for f, n in found]
    return f"{first} ({_location(*found[0])})" if found else first


# -- resolving what scripts and what is traced -----------------------------------------------

@contextlib.contextmanager
def fresh_types_on_failure():
    """TorchScript caches the type it builds for each module class, and keeps a type whose
    compilation failed half defined: scripting the same classes again fails with "Can't
    redefine method". After a failure the cache is replaced, so the next attempt builds fresh
    types (modules scripted before keep theirs)."""
    try:
        yield
    except BaseException:
        import torch.jit._recursive as recursive
        recursive.concrete_type_store = recursive.ConcreteTypeStore()
        raise


@contextlib.contextmanager
def _exported(klass, methods):
    """`klass`'s `methods` marked for scripting (torch.jit.export) for the duration of the block."""
    from torch._jit_internal import FunctionModifiers
    marked = [fn for fn in (getattr(klass, m, None) for m in methods)
              if inspect.isfunction(fn) and "_torchscript_modifier" not in fn.__dict__]
    for fn in marked:
        fn._torchscript_modifier = FunctionModifiers.EXPORT
    try:
        yield
    finally:
        for fn in marked:
            fn.__dict__.pop("_torchscript_modifier", None)


def script_error(module: nn.Module, methods=()):
    """None if `module` scripts (with `methods` besides forward), else TorchScript's reason in
    one line."""
    failure = _script_failure(module, methods)
    return None if failure is None else failure[0]


def _script_failure(module: nn.Module, methods=()):
    """None if `module` scripts, with `methods` (besides forward: those a phase calls on it),
    else (TorchScript's reason in one line, whether the code that failed is the module's own
    rather than a submodule's)."""
    if isinstance(module, torch.jit.ScriptModule):
        return None
    try:
        with warnings.catch_warnings(), fresh_types_on_failure(), _exported(type(module), methods):
            warnings.simplefilter("ignore")
            modes = {name: m.training for name, m in module.named_modules()}
            module.eval()  # scripting reads properties: no spectral-norm power iteration now
            try:
                scripted = torch.jit.script(module)
            finally:
                for name, m in module.named_modules():
                    m.training = modes[name]
        call = python_call(scripted)
        if call is None:
            return None
        # Scripting kept a call of a Python function (@torch.jit.ignore): saving would fail.
        return call[0], _in_own_code(module, call[1])
    except Exception as e:  # noqa: BLE001 - any failure means: not scriptable as it is
        return script_failure(e), _in_own_code(module, str(e))


def _in_own_code(module: nn.Module, text: str) -> bool:
    """Whether the first place TorchScript's error names is in the module's own class."""
    found = [(f, int(n)) for f, n in re.findall(r'File "([^"]+)", line (\d+)', text)
             if not f.startswith(_TORCH_DIR)]
    if not found:
        return True
    filename, line = found[0]
    for klass in type(module).__mro__:
        if klass is nn.Module:
            break
        for value in vars(klass).values():
            value = value.fget if isinstance(value, property) else value
            if not inspect.isfunction(value):
                continue
            try:
                lines, start = inspect.getsourcelines(value)
                if os.path.samefile(inspect.getsourcefile(value), filename) and start <= line < start + len(lines):
                    return True
            except (TypeError, OSError):
                continue
    return False


class _Container(nn.Module):
    """A submodule no scripted code calls: its parameters, buffers and children under the same
    names, without its forward (which did not script)."""


# What nn.Module keeps in an instance's __dict__ for itself: not the user's attributes.
_MODULE_STATE = set(vars(nn.Module()))


def _with_attributes(original: nn.Module, replacement):
    """`replacement` (a child's scripted or traced form) with the Python attributes of
    `original` it lacks (R3GAN's parent reads `self.MainLayers[0].DataType`, a dtype the
    scripted child does not keep): a traced parent sees its children as the user wrote them."""
    if replacement is None or replacement is original:
        return replacement
    for name, value in vars(original).items():
        if name in _MODULE_STATE or name.startswith("__") or hasattr(replacement, name):
            continue
        try:
            setattr(replacement, name, value)
        except (AttributeError, RuntimeError, TypeError):  # a name TorchScript keeps for itself
            pass
    return replacement


def _container(module: nn.Module, children: dict) -> nn.Module:
    box = _Container()
    box.training = module.training
    for name, p in module._parameters.items():
        box.register_parameter(name, p)
    for name, b in module._buffers.items():
        box.register_buffer(name, b, persistent=name not in module._non_persistent_buffers_set)
    for name, child in module._modules.items():
        box.add_module(name, children.get(name, child))
    return box


@dataclass
class Decision:
    """What became of one submodule: scripted, traced (with why) or a container."""
    path: str
    kind: str
    detail: str = ""


@dataclass
class Resolver:
    probe: Probe

    def resolve(self, module: nn.Module, path: str):
        """What `module` becomes in the archive: itself if it scripts (with its children
        resolved if need be), its trace if something calls it, a container if nothing does.
        Returns (replacement, decisions, refusal); replacement None with the refusal where it
        can only go in as part of a traced parent."""
        # The methods the phases call besides forward (a discriminator's compute_loss) must
        # script too, else the module is traced at its calls, those methods included.
        called = sorted({c.method for c in self.probe.calls.get(path, []) if c.method != "forward"})
        if augment.is_nvidias(module) and not called:
            return augment.from_nvidia(module), [Decision(path, "replaced", augment.REPLACED)], None
        failure = _script_failure(module, called)
        if failure is None:
            return module, [Decision(path, "scripted")], None
        error, own = failure
        if own and self.probe.calls.get(path):
            # Its own code does not script: scripting its children would not change that.
            return self._traced(module, path, error)
        children, decisions, refusal = {}, [], None
        for name, child in module.named_children():
            new, below, why = self.resolve(child, f"{path}.{name}")
            decisions += below
            refusal = refusal or why
            children[name] = _with_attributes(child, new)
        if refusal is None and any(new is not child for new, child in zip(children.values(), module.children())):
            saved = dict(module._modules)
            module._modules.update(children)
            if script_error(module) is None:
                return module, decisions + [Decision(path, "scripted")], None
            module._modules.update(saved)
        if not self.probe.calls.get(path):
            if refusal is not None:
                # No trace of this module would hold the child: the child's refusal is final.
                return None, [], refusal
            kept = {name: new if new is not None else self._container(child, f"{path}.{name}")
                    for (name, child), new in zip(module.named_children(), children.values())}
            # Its own line says it: the containers below it are not listed one by one.
            below = [d for d in decisions if d.kind != "container"]
            return _container(module, kept), below + [Decision(path, "container",
                                                               f"no phase calls it; its forward: {error}")], None
        return self._traced(module, path, error)

    def _traced(self, module, path, error):
        try:
            traced, detail = trace_module(module, path, self.probe, error)
        except ExportError as e:
            return None, [], e
        return traced, [Decision(path, "traced", detail)], None

    def _container(self, module, path):
        """A submodule only its (uncalled) parent called: a container too, all the way down."""
        kids = {name: child if script_error(child) is None else self._container(child, f"{path}.{name}")
                for name, child in module.named_children()}
        return _container(module, kids)
