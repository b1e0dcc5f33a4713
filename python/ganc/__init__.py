"""ganc from Python: export a GAN and its training phases to one TorchScript archive,
compile it, train it.

    import ganc
    ganc.export(gan, "dcgan.pt", spec)                 # scripted
    ganc.export(gan, "dcgan.pt", spec, trace=True)     # traced, one trace per phase method
    plan = ganc.compile("dcgan.pt")                    # a ganc.Plan: .explain(), .used(phase)
    summary = ganc.train(plan, data="digits.pt", nproc=2, steps=500, out="runs/dcgan")

The spec (see docs/spec.md) is validated against the module and stored in the archive as the
extra file ``ganc.json``; ``ganc compile`` reads both.

torch is imported when something that needs it is first used: the `ganc` command and the
TensorBoard writer start without it.
"""
from __future__ import annotations

import importlib

from .api import GancError, GancWarning, Plan, compile, simulate, train

# Name -> the submodule that defines it, imported on first use (PEP 562).
_LAZY = {
    "export": "exporter", "load_spec": "exporter", "load_checkpoint": "exporter",
    "example_inputs": "phases", "phase_methods_scripted": "exporter",
    "make_scriptable": "scriptable", "ExportError": "scriptable",
    "SPEC_VERSION": "spec", "SpecError": "spec", "validate": "spec", "dumps": "spec",
    "stylegan_snapshot": "snapshots",
}

__all__ = ["export", "compile", "train", "simulate", "Plan", "GancError", "GancWarning", "load_spec",
           "load_checkpoint", "example_inputs", "make_scriptable", "ExportError", "SPEC_VERSION",
           "SpecError", "validate", "stylegan_snapshot"]


_SUBMODULES = {"spec", "scriptable", "exporter", "reference", "recipes", "tensorboard", "plot", "cli", "api"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module("." + name, __name__)
    if name in _LAZY:
        value = getattr(importlib.import_module("." + _LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ganc' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
