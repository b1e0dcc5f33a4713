"""Operator libraries: TORCH_LIBRARY shared libraries whose operators a network calls
(`torch.ops.<ns>.<op>`), loaded at export and named in the archive (`ganc_ops.json`), so
`ganc compile` and `ganc train` can refuse, in one line, to start without them
(`--op-library`).

A Python `torch.library.custom_op` registers a Python kernel, which ganc's C++ tools cannot
run: an archive whose code calls one is refused at export with what to do instead.
"""
from __future__ import annotations

import json
import os
import re

import torch

from .scriptable import ExportError

__all__ = ["load", "load_ganc_ops", "used_ops", "requirements", "Recorder", "backward_reads"]

# Namespaces of PyTorch's own operators, which every LibTorch has.
_BUILTIN = {"aten", "prim", "prims", "quantized", "onnx", "profiler", "cuda", "_caffe2", "attr", "scope",
            "rngprims", "debugprims", "_quantized", "_c10d_functional", "c10d", "c10d_functional",
            "_dtensor", "mkldnn", "mkl", "xnnpack", "sparse", "_nested_tensor", "inductor", "higher_order"}

def load(paths) -> list:
    """Loads each library (torch.ops.load_library, once per process) and returns their paths."""
    loaded = []
    for path in paths or ():
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"ganc.export: op_libraries: {path}: no such file")
        try:
            torch.ops.load_library(path)
        except OSError as e:
            raise ExportError(f"ganc.export: op_libraries: {path} does not load: {e}") from None
        loaded.append(path)
    return loaded


def load_ganc_ops() -> bool:
    """ganc's own operators (libganc_ops.so: ganc::convolution, ganc::upfirdn2d, ...) in
    torch.ops.ganc: $GANC_OPS, else the library beside the installed tools (a pip install's
    ganc/_bin, an editable install's or $GANC_BUILD_DIR's build tree). False where none is
    built."""
    if hasattr(torch.ops.ganc, "convolution"):
        return True
    from .cli import ToolsNotFound, tools_dir
    candidates = [os.environ.get("GANC_OPS", "")]
    try:
        tools = tools_dir()
        candidates += [os.path.join(tools, "libganc_ops.so"), os.path.join(tools, "..", "ops", "libganc_ops.so")]
    except ToolsNotFound:
        pass
    for path in candidates:
        if path and os.path.isfile(path):
            torch.ops.load_library(path)
            return hasattr(torch.ops.ganc, "convolution")
    return False


class Recorder:
    """While the probe runs (a context manager): the first call of each operator outside
    PyTorch's own namespaces made through torch.ops, with its arguments (to measure what its
    backward reads)."""

    def __init__(self):
        self.calls = {}
        self._saved = []

    def __enter__(self):
        recorder = self
        for cls in (torch._ops.OpOverloadPacket, torch._ops.OpOverload):
            original = cls.__call__

            def call(op, *args, _original=original, **kwargs):
                name = op._schema.name if isinstance(op, torch._ops.OpOverload) else op._qualified_op_name
                if name.split("::")[0] not in _BUILTIN and name not in recorder.calls:
                    recorder.calls[name] = (op, tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a
                                                      for a in args), dict(kwargs))
                return _original(op, *args, **kwargs)

            self._saved.append((cls, original))
            cls.__call__ = call
        return self

    def __exit__(self, *exc):
        for cls, original in self._saved:
            cls.__call__ = original
        self._saved.clear()
        return False


def backward_reads(func, args, kwargs) -> list:
    """Per operand a gradient flows through, the operands the op's backward reads, measured
    with autograd: the first derivative against a random cotangent (create_graph) and which
    operands its graph reaches. What ganc's used-parameter analysis needs of the op to agree
    with eager autograd on which parameters a gradient penalty reaches."""
    inputs = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
              else a for a in args]
    wrt = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.requires_grad]
    rows = [[] for _ in inputs]
    gen = torch.Generator().manual_seed(0)
    with torch.enable_grad():
        out = func(*inputs, **kwargs)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out])
                if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outs:
            return rows
        cot = [torch.randn(o.shape, generator=gen).to(o) for o in outs]
        for i in wrt:
            (g,) = torch.autograd.grad(outs, [inputs[i]], cot, create_graph=True, retain_graph=True,
                                       allow_unused=True)
            if g is None or not g.requires_grad:
                continue
            weight = torch.randn(g.shape, generator=gen).to(g)
            reached = torch.autograd.grad([(g * weight).sum()], [inputs[j] for j in wrt], retain_graph=True,
                                          allow_unused=True)
            rows[i] = [j for j, h in zip(wrt, reached) if h is not None]
    return rows


def _python_kernel(op: str) -> bool:
    """Whether the operator was registered from Python (torch.library.custom_op, or a
    torch.library.Library with Python kernels): its registration names a .py file."""
    try:
        dump = torch._C._dispatch_dump(op)
    except RuntimeError:
        return False
    found = re.search(r"debug: registered at (\S+?):\d+", dump)
    return bool(found and found.group(1).endswith(".py"))


def _walk(block, found, where):
    for node in block.nodes():
        kind = node.kind()
        namespace = kind.split("::")[0]
        if "::" in kind and namespace not in _BUILTIN:
            found.setdefault(kind, where)
        for inner in node.blocks():
            _walk(inner, found, where)


def used_ops(scripted) -> dict:
    """{operator: where it is called} for every operator outside PyTorch's own namespaces
    that the scripted archive's code calls."""
    found = {}
    for path, module in scripted.named_modules():
        for name in module._c._method_names():
            _walk(module._c._get_method(name).graph, found, f"{path or '(the GAN)'}.{name}")
    return found


def requirements(scripted, libraries: list, calls: dict | None = None) -> str | None:
    """ganc_ops.json for the archive (None when its code calls no operator outside PyTorch's
    own): the operators and the libraries the export loaded for them. ExportError for an
    operator registered from Python, or a native one with no library given."""
    used = used_ops(scripted)
    for op, where in sorted(used.items()):
        if _python_kernel(op):
            raise ExportError(
                f"ganc.export: {where} calls the operator {op}, which is registered from Python (a "
                "torch.library.custom_op): ganc's C++ tools cannot run Python kernels; register it in C++ "
                "with TORCH_LIBRARY, its kernels and its autograd kernel, build it as a shared library and "
                "pass it: ganc.export(..., op_libraries=[path])")
        if not libraries:
            raise ExportError(
                f"ganc.export: {where} calls the operator {op}, which no library in op_libraries provides: "
                "pass the TORCH_LIBRARY shared library that registers it, ganc.export(..., "
                "op_libraries=[path]), so the archive names it and ganc compile and ganc train can load it")
    if not used:
        return None
    needs = {"libraries": [os.path.basename(p) for p in libraries], "ops": sorted(used)}
    measured = {op: backward_reads(*calls[op]) for op in sorted(used) if op in (calls or {})}
    if measured:
        needs["backward_reads"] = measured
    return json.dumps(needs, indent=1)
