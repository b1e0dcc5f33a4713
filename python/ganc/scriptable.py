"""Scriptable equivalents of PyTorch's hook- and parametrization-based weight reparametrisations.

`torch.jit.script` refuses the modules people write GAN discriminators with:
`torch.nn.utils.spectral_norm` and `weight_norm` compute the weight in a forward pre-hook
(a Python object), and `torch.nn.utils.parametrizations.spectral_norm` / `weight_norm` make
`weight` a Python property of a generated class. `make_scriptable` returns a copy of a module
tree in which each such layer computes its weight in a scriptable property instead, with:

- the same state_dict names and tensors (`weight_orig`, `weight_u`, `weight_v`;
  `parametrizations.weight.original`, `parametrizations.weight.0._u`, ...), so checkpoints
  load into the user's own modules;
- the same arithmetic, operation for operation: the power iteration in training mode (the
  hook API updates v then u, the parametrization API u then v), the contiguous snapshots of
  u and v, `weight / sigma`; `torch._weight_norm` for weight norm.

Supported (the documented list): spectral norm and weight norm, both APIs, on the `weight` of
any layer whose forward reads `self.weight` once (Linear, Conv1d/2d/3d, ConvTranspose1d/2d/3d,
Embedding, ...). Any other parametrization is kept as it is (it must be scriptable itself);
a chain of several parametrizations on one tensor, or one on another tensor than `weight`, is
refused with the layer's path.

`torch.nn.SyncBatchNorm` (a model written for DDP, `convert_sync_batchnorm`) is not scriptable
either: its forward calls torch.distributed. It becomes the batch norm it computes on one rank,
with the same state_dict, and `ganc.export` lists it in the spec's `sync_batch_norm`, which
ganc runs over the ranks.
"""
from __future__ import annotations

import copy
import os
import re
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils import parametrize
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm


class ExportError(ValueError):
    """A model ganc.export cannot turn into a trainable archive; the message names the layer."""


def _matrix(weight: Tensor, dim: int) -> Tensor:
    """The weight as a matrix with `dim` first (both spectral-norm APIs' reshape)."""
    if dim != 0:
        order: List[int] = [dim]
        for d in range(weight.dim()):
            if d != dim:
                order.append(d)
        weight = weight.permute(order)
    return weight.reshape(weight.size(0), -1)


class _SpectralNormHookWeight:
    """`weight` of a layer under torch.nn.utils.spectral_norm (the forward pre-hook's
    compute_weight, with do_power_iteration = self.training)."""

    @property
    def weight(self) -> Tensor:
        weight = self.weight_orig
        weight_mat = _matrix(weight, self._ganc_dim)
        if self.training:
            # detach() as well as no_grad(): a trace does not record no_grad scopes, and the
            # buffers' in-place updates must stay out of autograd in a traced archive too.
            with torch.no_grad():
                mat = weight_mat.detach()
                for _ in range(self._ganc_power_iterations):
                    self.weight_v.copy_(F.normalize(torch.mv(mat.t(), self.weight_u), dim=0,
                                                    eps=self._ganc_eps))
                    self.weight_u.copy_(F.normalize(torch.mv(mat, self.weight_v), dim=0,
                                                    eps=self._ganc_eps))
        # Snapshots: a later call's in-place update must not change what this backward saved.
        u = self.weight_u.clone(memory_format=torch.contiguous_format)
        v = self.weight_v.clone(memory_format=torch.contiguous_format)
        sigma = torch.dot(u, torch.mv(weight_mat, v))
        return weight / sigma


class _WeightNormHookWeight:
    """`weight` of a layer under torch.nn.utils.weight_norm."""

    @property
    def weight(self) -> Tensor:
        return torch._weight_norm(self.weight_v, self.weight_g, self._ganc_dim)


class _ParametrizedWeight:
    """`weight` of a layer under torch.nn.utils.parametrize (one parametrization)."""

    @property
    def weight(self) -> Tensor:
        return self.parametrizations["weight"]()


class _Parametrization(nn.Module):
    """ParametrizationList's scriptable stand-in: the same `original` and child `0`."""

    def __init__(self, original: nn.Parameter, fn: nn.Module):
        super().__init__()
        self.original = original
        self.add_module("0", fn)

    def forward(self) -> Tensor:
        return getattr(self, "0")(self.original)


class _Parametrization2(nn.Module):
    """The same for a parametrization of two tensors (`original0`, `original1`: weight norm)."""

    def __init__(self, original0: nn.Parameter, original1: nn.Parameter, fn: nn.Module):
        super().__init__()
        self.original0 = original0
        self.original1 = original1
        self.add_module("0", fn)

    def forward(self) -> Tensor:
        return getattr(self, "0")(self.original0, self.original1)


class _SpectralNorm(nn.Module):
    """torch.nn.utils.parametrizations.spectral_norm's _SpectralNorm, scriptable: the same
    buffers `_u`, `_v` and arithmetic (u then v in the power iteration)."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.dim: int = original.dim
        self.eps: float = original.eps
        self.n_power_iterations: int = getattr(original, "n_power_iterations", 0)
        for name in ("_u", "_v"):
            if name in original._buffers:
                self.register_buffer(name, original._buffers[name])

    def forward(self, weight: Tensor) -> Tensor:
        if weight.dim() == 1:
            return F.normalize(weight, dim=0, eps=self.eps)
        weight_mat = _matrix(weight, self.dim)
        if self.training:
            with torch.no_grad():  # detached too, for traces (see _SpectralNormHookWeight)
                mat = weight_mat.detach()
                for _ in range(self.n_power_iterations):
                    self._u.copy_(F.normalize(torch.mv(mat, self._v), dim=0, eps=self.eps))
                    self._v.copy_(F.normalize(torch.mv(mat.t(), self._u), dim=0, eps=self.eps))
        u = self._u.clone(memory_format=torch.contiguous_format)
        v = self._v.clone(memory_format=torch.contiguous_format)
        sigma = torch.vdot(u, torch.mv(weight_mat, v))
        return weight / sigma


class _WeightNorm(nn.Module):
    """torch.nn.utils.parametrizations.weight_norm's _WeightNorm, scriptable."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        return torch._weight_norm(weight_v, weight_g, self.dim)


_CLASSES = {}


class _SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A torch.nn.SyncBatchNorm as the batch norm it computes on one rank (any input of at
    least 2 dimensions, as SyncBatchNorm takes); ganc synchronises it (`sync_batch_norm`)."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")


def sync_batch_norm_paths(module: nn.Module) -> List[str]:
    """The paths of `module`'s torch.nn.SyncBatchNorm layers, in module order."""
    return [path for path, sub in module.named_modules() if isinstance(sub, nn.SyncBatchNorm)]


def _with_weight(mixin, base):
    """The class `base` with `weight` computed by `mixin` (one per pair, reused)."""
    key = (mixin, base)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"{mixin.__name__.strip('_')}{base.__name__}", (mixin, base),
                             {"__module__": __name__})
    return _CLASSES[key]


def _hook_of(module: nn.Module, kind):
    found = [(key, hook) for key, hook in module._forward_pre_hooks.items() if isinstance(hook, kind)]
    return found[0] if found else (None, None)


def _convert_hook(path: str, module: nn.Module) -> bool:
    """A layer under the hook API: its hook and plain `weight` attribute replaced by a property.
    Returns whether it was one."""
    for kind, mixin in ((SpectralNorm, _SpectralNormHookWeight), (WeightNorm, _WeightNormHookWeight)):
        key, hook = _hook_of(module, kind)
        if hook is None:
            continue
        if hook.name != "weight":
            raise ExportError(f"ganc.export: {path}: {kind.__name__} on {hook.name!r}; ganc supports it on "
                              "'weight' only")
        del module._forward_pre_hooks[key]
        for hooks in (module._state_dict_hooks, module._load_state_dict_pre_hooks):
            for k in [k for k, h in hooks.items() if getattr(h, "fn", None) is hook]:
                del hooks[k]
        module.__dict__.pop("weight", None)
        module._ganc_dim = hook.dim
        if kind is SpectralNorm:
            module._ganc_eps = hook.eps
            module._ganc_power_iterations = hook.n_power_iterations
        module.__class__ = _with_weight(mixin, type(module))
        return True
    return False


def _convert_parametrized(path: str, module: nn.Module) -> None:
    """A layer under torch.nn.utils.parametrize: its generated class replaced by the original
    class with a scriptable `weight`, its ParametrizationList by a scriptable stand-in."""
    names = list(module.parametrizations.keys())
    if names != ["weight"]:
        raise ExportError(f"ganc.export: {path}: parametrizations of {names}; ganc supports one on "
                          "'weight' only")
    plist = module.parametrizations["weight"]
    if len(plist) != 1:
        raise ExportError(f"ganc.export: {path}: {len(plist)} parametrizations chained on 'weight'; "
                          "ganc supports one")
    fn = plist[0]
    kind = type(fn).__name__
    if kind == "_SpectralNorm":
        fn = _SpectralNorm(fn)
    elif kind == "_WeightNorm":
        fn = _WeightNorm(fn.dim)
    if hasattr(plist, "original"):
        stand_in = _Parametrization(plist.original, fn)
    else:
        stand_in = _Parametrization2(plist.original0, plist.original1, fn)
    module.parametrizations = nn.ModuleDict({"weight": stand_in})
    base = type(module).__bases__[0]  # parametrize's generated class derives from the original
    module.__class__ = _with_weight(_ParametrizedWeight, base)


def make_scriptable(module: nn.Module) -> nn.Module:
    """A deep copy of `module` whose spectral-norm and weight-norm layers (both APIs) compute
    their weight in scriptable code, with unchanged state_dict names and numerics, and whose
    torch.nn.SyncBatchNorm layers are batch norm (see sync_batch_norm_paths). The module
    passed in is not modified."""
    # The hook API keeps the last computed weight as a plain attribute, a non-leaf tensor that
    # deepcopy refuses; the copy does not need it (its property computes the weight).
    computed = {sub: sub.__dict__.pop("weight") for sub in module.modules()
                if "weight" in sub.__dict__ and any(isinstance(h, (SpectralNorm, WeightNorm))
                                                    for h in sub._forward_pre_hooks.values())}
    try:
        module = copy.deepcopy(module)
    finally:
        for sub, weight in computed.items():
            sub.__dict__["weight"] = weight
    for path, sub in list(module.named_modules()):
        path = path or type(module).__name__
        if parametrize.is_parametrized(sub):
            _convert_parametrized(path, sub)
        elif isinstance(sub, nn.SyncBatchNorm):
            del sub.process_group
            sub.__class__ = _SyncBatchNorm
        else:
            _convert_hook(path, sub)
    return module


def _location(filename: str, line: int) -> str:
    try:
        rel = os.path.relpath(filename)
        filename = rel if not rel.startswith("..") else filename
    except ValueError:
        pass
    return f"{filename}:{line}"


def python_call(scripted):
    """(what, TorchScript's source text) of the first call of a Python function a scripted
    module kept (prim::PythonOp: a @torch.jit.ignore'd function, which runs in Python and which
    torch.jit.save refuses: "Could not export Python function call"), or None."""
    for sub in scripted.modules():
        for name in sub._c._method_names():
            blocks = [sub._c._get_method(name).graph]
            while blocks:
                for node in blocks.pop().nodes():
                    if node.kind() == "prim::PythonOp":
                        text = str(node.sourceRange())
                        found = re.search(r'File "([^"]+)", line (\d+)', text)
                        where = f" ({_location(found.group(1), int(found.group(2)))})" if found else ""
                        return (f"it calls the Python function {node.pyname()!r}{where}, which runs in Python "
                                "and which an archive cannot hold"), text
                    blocks.extend(node.blocks())
    return None
