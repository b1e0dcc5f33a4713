"""ganc's Python helper: export a GAN and its training phases to one TorchScript archive.

    import ganc
    ganc.export(gan, "dcgan.pt", spec)                 # scripted
    ganc.export(gan, "dcgan.pt", spec, trace=True)     # traced, one trace per phase method

The spec (see docs/spec.md) is validated against the module and stored in the archive as the
extra file ``ganc.json``; ``ganc compile`` reads both.
"""
from __future__ import annotations

import contextlib

import torch

from .spec import SPEC_VERSION, SpecError, dumps, validate

__all__ = ["export", "load_spec", "load_checkpoint", "example_inputs", "SPEC_VERSION", "SpecError", "validate"]


def example_inputs(spec: dict, phase: dict, batch: int | None = None) -> tuple:
    """Tensors of the right shapes for one call of a phase method (for tracing and tests)."""
    batch = batch or spec["batch_size"]
    dtype = getattr(torch, spec.get("dtype", "float32"))
    out = []
    for inp in phase["inputs"]:
        if inp["source"] == "fade":
            out.append(torch.rand(()).to(dtype))
            continue
        if inp["source"] in ("labels", "categorical"):
            out.append(torch.randint(inp.get("classes", spec["data"].get("classes", 1)), (batch,)))
            continue
        shape = spec["data"]["shape"] if inp["source"] == "data" else inp["shape"]
        draw = torch.rand if inp["source"] == "uniform" else torch.randn
        out.append(draw([batch] + list(shape)).to(dtype))
    return tuple(out)


@contextlib.contextmanager
def phase_methods_scripted(gan: torch.nn.Module, methods, script: bool = True):
    """Marks the phase methods for scripting (or, for tracing, unmarks them) for the duration
    of the block, restoring the class afterwards: user classes are left as they were."""
    from torch._jit_internal import FunctionModifiers
    saved = []
    for name in methods:
        for klass in type(gan).__mro__:
            fn = klass.__dict__.get(name)
            if fn is not None:
                saved.append((fn, fn.__dict__.get("_torchscript_modifier", _MISSING)))
                if script:
                    fn._torchscript_modifier = FunctionModifiers.EXPORT
                elif "_torchscript_modifier" in fn.__dict__:
                    del fn._torchscript_modifier
                break
    try:
        yield
    finally:
        for fn, old in saved:
            if old is _MISSING:
                fn.__dict__.pop("_torchscript_modifier", None)
            else:
                fn._torchscript_modifier = old


_MISSING = object()


def export(gan: torch.nn.Module, path: str, spec: dict, trace: bool = False) -> dict:
    """Scripts (or traces) `gan` with every phase method and writes it with its spec to `path`.

    Returns the validated spec. Raises SpecError for a spec that names a method or submodule
    that does not exist, and ValueError for a phase that does not return a scalar.
    """
    spec = validate(spec, gan)
    gan.train()
    for phase in spec["phases"]:
        loss = getattr(gan, phase["method"])(*example_inputs(spec, phase, batch=2))
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise SpecError(f"spec: phase {phase['name']!r}: method {phase['method']!r} must "
                            f"return a scalar loss tensor")
    names = [p["method"] for p in spec["phases"]]
    # Phase methods need not be decorated by the user.
    with phase_methods_scripted(gan, names, script=not trace):
        if trace:
            methods = {p["method"]: example_inputs(spec, p) for p in spec["phases"]}
            scripted = torch.jit.trace_module(gan, methods, check_trace=False)
        else:
            scripted = torch.jit.script(gan)
    torch.jit.save(scripted, path, _extra_files={"ganc.json": dumps(spec)})
    return spec


def load_spec(path: str) -> dict:
    """The ganc.json stored in an archive."""
    files = {"ganc.json": ""}
    torch.jit.load(path, _extra_files=files)
    import json
    return json.loads(files["ganc.json"])


def load_checkpoint(path: str) -> dict:
    """Loads a file ganc wrote (checkpoint.pt, gradient dumps) with torch.load.

    LibTorch's pickler wraps containers in `torch.jit._pickle` helpers (restore_type_tag,
    build_doublelist, ...), plain identity functions that the weights-only unpickler does not
    allow by default; allowing them keeps the load weights-only.
    `torch.load(path, weights_only=False)` also works.
    """
    import torch.jit._pickle as jp
    helpers = [jp.restore_type_tag, jp.build_intlist, jp.build_tensorlist, jp.build_doublelist,
               jp.build_boollist]
    with torch.serialization.safe_globals(helpers):
        return torch.load(path, weights_only=True)
