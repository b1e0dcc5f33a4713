"""What a phase method takes and returns: example inputs of the spec's shapes, the loss of its
output, and the autocast it runs under. Shared by the export, the joint capture, the eager
reference and the tests."""
from __future__ import annotations

import contextlib

import torch

from .spec import SpecError, sample_shape

__all__ = ["autocast", "example_inputs", "phase_loss"]


def autocast(device: str, precision: str):
    """torch.autocast for a phase's precision ("float32": none), as ganc applies it: with its
    cache of each parameter's cast on (the default in eager; a trace turns it off, and without
    it a parameter read twice is cast twice and its two gradients meet in float32, not in the
    cast's dtype)."""
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast("cuda" if device == "cuda" else "cpu", dtype=getattr(torch, precision),
                          cache_enabled=True)


def example_inputs(spec: dict, phase: dict, batch: int | None = None, values: dict | None = None) -> tuple:
    """Tensors of the right shapes for one call of a phase method (for tracing and tests).
    `values` holds what earlier phases handed on, by "phase.name" (see run_phases)."""
    batch = batch or spec["batch_size"]
    dtype = getattr(torch, spec.get("dtype", "float32"))
    out = []
    for inp in phase["inputs"]:
        if inp["source"] == "output":
            if values is None or inp["output"] not in values:
                raise SpecError(f"spec: phase {phase['name']!r}: input {inp['name']!r} takes "
                                f"{inp['output']!r}, which no earlier phase returned")
            out.append(values[inp["output"]].detach())
            continue
        if inp["source"] == "fade":
            out.append(torch.rand(()).to(dtype))
            continue
        if inp["source"] == "controller":
            out.append(torch.tensor(float(spec["controllers"][inp["controller"]].get("initial", 0.0))).to(dtype))
            continue
        if inp["source"] in ("labels", "categorical"):
            out.append(torch.randint(inp.get("classes", spec["data"].get("classes", 1)), (batch,)))
            continue
        shape = sample_shape(spec, inp.get("field")) if inp["source"] == "data" else inp["shape"]
        draw = torch.rand if inp["source"] == "uniform" else torch.randn
        out.append(draw([batch] + list(shape)).to(dtype))
    return tuple(out)


def phase_loss(output, phase: dict) -> torch.Tensor:
    """The loss of a phase method's output: the output itself, or the first element of
    `(loss, {name: tensor})`, whose scalar values ganc logs (stats.jsonl, TensorBoard) and
    whose `outputs` it hands on."""
    where = f"spec: phase {phase['name']!r}: method {phase['method']!r}"
    outputs = set(phase.get("outputs", []))
    if isinstance(output, tuple):
        if (len(output) != 2 or not isinstance(output[1], dict)
                or not all(isinstance(k, str) and isinstance(v, torch.Tensor) and (v.numel() == 1 or k in outputs)
                           for k, v in output[1].items())):
            raise SpecError(f"{where} returns a tuple: it must be (loss, {{name: scalar tensor, ...}})")
        output = output[0]
    if not isinstance(output, torch.Tensor) or output.dim() != 0:
        raise SpecError(f"{where} must return a scalar loss tensor (or (loss, {{name: scalar}}))")
    return output
