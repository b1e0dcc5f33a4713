"""Each phase captured as one joint graph of ATen ops: its forward, every `autograd.grad` inside
it (`create_graph` included, so R1's and path length's double backward), and the gradients of
the parameters it updates, with parameters, buffers and inputs as the graph's inputs.

The capture runs the phase method once under `make_fx`, the way AOTAutograd builds its joint
graphs: what autograd really ran is what is recorded. `no_grad` and `.detach()` leave no
backward ops, a Function's own backward is recorded as the ops it ran, and an in-place buffer
update (batch-norm statistics, a power iteration) is an in-place op on the buffer's input.
The used parameters are read off the graph: those whose gradient it computes.

A captured phase is written as ganc's op list (`to_file`): a torch.save container (the zip
torch and LibTorch read) holding `graph`, the op list as JSON text, and `constants`, the
tensors the phase's code made (its format is docs/ir.md's "Joint graphs"). `ganc joint` runs
one on given tensors through the dispatcher, with no autograd engine and no TorchScript.
"""
from __future__ import annotations

import io
import json
import math
import operator
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.utils.stateless import _reparametrize_module

from .phases import autocast, example_inputs, phase_loss
from .probe import raised_at
from .scriptable import ExportError

__all__ = ["JOINT_VERSION", "JointGraph", "archive_entries", "capture", "to_file"]

JOINT_VERSION = 1


@dataclass
class JointGraph:
    """One phase's joint graph: `inputs` and `outputs` are (kind, name) pairs in the graph's
    order; kinds are parameter, buffer, input and constant in, loss, gradient and buffer out."""
    phase: str
    method: str
    module: torch.fx.GraphModule
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    constants: dict = field(default_factory=dict)

    @property
    def used(self) -> list[str]:
        """The parameters whose gradient the phase computes, in the gan's order."""
        return [name for kind, name in self.outputs if kind == "gradient"]


def _updated(gan: nn.Module, phase: dict) -> list[str]:
    owners = phase["updates"]
    return [n for n, _ in gan.named_parameters() if any(n == o or n.startswith(o + ".") for o in owners)]


def capture(gan: nn.Module, phase: dict, args: tuple, precision: str = "float32") -> JointGraph:
    """`phase`'s joint graph (a spec phase: its method and the submodules it updates) traced on
    the phase method's arguments `args`, its method run under autocast to `precision`
    ("bfloat16", "float16") as the runtime runs it: the graph holds autocast's casts as ops.
    `gan` is left as it was: the capture runs on copies of its parameters and buffers."""
    if "updates" not in phase:
        raise ExportError(f"ganc.joint: phase {phase['name']!r} is a section (it trains nothing and hands its "
                          "values on): sections are not captured yet")
    if phase.get("outputs"):
        raise ExportError(f"ganc.joint: phase {phase['name']!r} hands values on ({', '.join(phase['outputs'])}): "
                          "phases that hand values on are not captured yet")
    params = dict(gan.named_parameters())
    buffers = dict(gan.named_buffers())
    updated = _updated(gan, phase)
    pnames, bnames = list(params), list(buffers)
    used: list[str] = []
    logged: list[str] = []

    def joint(p, b, inputs, seed):
        state = {**dict(zip(pnames, p)), **dict(zip(bnames, b))}
        with _reparametrize_module(gan, state, tie_weights=True):
            with autocast("cpu", precision):
                output = getattr(gan, phase["method"])(*inputs)
            loss = phase_loss(output, phase)
            stats = output[1] if isinstance(output, tuple) else {}
            wrt = [state[n] for n in updated]
            # The seed is the loss's gradient: 1, or the runtime's loss scale / micro-batches,
            # as autograd seeds (loss / accumulate * scale).backward().
            grads = torch.autograd.grad(loss, wrt, grad_outputs=seed, allow_unused=True) if wrt else ()
        used[:] = [n for n, g in zip(updated, grads) if g is not None]  # known while tracing
        logged[:] = list(stats)
        return loss, [g for g in grads if g is not None], list(b), [v.detach() for v in stats.values()]

    p = [t.detach().clone().requires_grad_(t.requires_grad) for t in params.values()]
    b = [t.detach().clone() for t in buffers.values()]
    inputs = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
    # A loss has its parameters' dtype (float32 under autocast too).
    seed = torch.ones((), dtype=next((t.dtype for t in p if t.is_floating_point()), torch.float32))
    try:
        module = make_fx(joint)(p, b, inputs, seed)
    except RuntimeError as e:
        if "tracing tensor" not in str(e) and "data-dependent" not in str(e):
            raise
        raise ExportError(f"ganc.joint: phase {phase['name']!r} ({phase['method']}): a Python value read from a "
                          f"tensor ({raised_at(e) or '<unknown>'}) decides what runs, which a joint graph cannot hold; keep the "
                          "phase with TorchScript (ganc.export) or write the choice with torch.where or "
                          "torch.cond") from None
    graph = JointGraph(phase["name"], phase["method"], module)
    graph.inputs = ([("parameter", n) for n in pnames] + [("buffer", n) for n in bnames]
                    + [("input", inp["name"]) for inp in phase["inputs"]] + [("seed", "loss")])
    graph.outputs = ([("loss", "loss")] + [("gradient", n) for n in used] + [("buffer", n) for n in bnames]
                     + [("stat", n) for n in logged])
    graph.constants = {name: getattr(module, name).detach().clone() for name in _constants(module)}
    return graph


def _constants(module: torch.fx.GraphModule) -> list[str]:
    return [n.target for n in module.graph.nodes if n.op == "get_attr"]


# -- the op list -------------------------------------------------------------------------------

_NAMES = {torch.dtype: "dtype", torch.device: "device", torch.layout: "layout", torch.memory_format: "memory_format"}


def _encode(a, where: str):
    """An op's argument in the op list's JSON (docs/ir.md, "Joint graphs")."""
    if isinstance(a, torch.fx.Node):
        return {"value": a.name}
    if isinstance(a, bool):
        return {"bool": a}
    if isinstance(a, int):
        return a
    if isinstance(a, float):
        return {"float": a if math.isfinite(a) else repr(a)}
    if a is None:
        return None
    if isinstance(a, str):
        return {"str": a}
    for kind, key in _NAMES.items():
        if isinstance(a, kind):
            return {key: str(a).replace("torch.", "")}
    if isinstance(a, (list, tuple)):
        return [_encode(x, where) for x in a]
    raise ExportError(f"ganc.joint: {where}: an argument of type {type(a).__name__} ({a!r}) has no form in the "
                      "op list")


def _op(target) -> tuple[str, str]:
    """('aten::addmm', 'default') of an OpOverload."""
    schema = target._schema
    return schema.name, schema.overload_name or "default"


def _result_types(value) -> list:
    """What a node makes, as the op list records it: per result its dtype and shape (null for a
    result that is not a tensor)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [{"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
            if isinstance(v, torch.Tensor) else None for v in values]


def op_list(graph: JointGraph) -> dict:
    """The graph as ganc's op list: inputs, nodes in execution order, outputs."""
    nodes, inputs, outputs = [], [], []
    placeholders = [n for n in graph.module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(graph.inputs):
        raise ExportError(f"ganc.joint: phase {graph.phase!r}: {len(placeholders)} graph inputs for "
                          f"{len(graph.inputs)} parameters, buffers and inputs")
    for node, (kind, name) in zip(placeholders, graph.inputs):
        port = {"value": node.name, "kind": kind, "name": name}
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):  # what the graph was captured for (its shapes are fixed)
            port.update(shape=list(value.shape), dtype=str(value.dtype).replace("torch.", ""))
        inputs.append(port)
    for node in graph.module.graph.nodes:
        where = f"phase {graph.phase!r}, node {node.name}"
        if node.op == "get_attr":
            inputs.append({"value": node.name, "kind": "constant", "name": node.target})
        elif node.op == "call_function" and node.target is operator.getitem:
            nodes.append({"out": node.name, "op": "getitem", "args": [_encode(a, where) for a in node.args],
                          "results": _result_types(node.meta.get("val"))})
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            name, overload = _op(node.target)
            nodes.append({"out": node.name, "op": name, "overload": overload,
                          "args": [_encode(a, where) for a in node.args],
                          "kwargs": {k: _encode(v, where) for k, v in node.kwargs.items()},
                          "results": _result_types(node.meta.get("val"))})
        elif node.op == "output":
            values = list(torch.utils._pytree.tree_leaves(node.args[0]))
            if len(values) != len(graph.outputs):
                raise ExportError(f"ganc.joint: phase {graph.phase!r}: {len(values)} graph outputs for "
                                  f"{len(graph.outputs)} loss, gradients and buffers")
            for (kind, name), value in zip(graph.outputs, values):
                outputs.append({"value": _encode(value, where), "kind": kind, "name": name})
        elif node.op != "placeholder":
            raise ExportError(f"ganc.joint: {where}: {node.op} {node.target} is not an ATen op")
    return {"ganc_joint": JOINT_VERSION, "phase": graph.phase, "method": graph.method,
            "inputs": inputs, "nodes": nodes, "outputs": outputs}


def to_file(graph: JointGraph, path) -> None:
    """Writes the captured phase as ganc's op list with its constants (docs/ir.md); `path` may
    be a file object."""
    torch.save({"graph": json.dumps(op_list(graph)), "constants": graph.constants}, path)


def _set_stage(gan: nn.Module, spec: dict, index: int) -> None:
    for path in spec["stages"]["attributes"]:
        owner, _, attribute = path.rpartition(".")
        setattr(gan.get_submodule(owner) if owner else gan, attribute, index)


def archive_entries(gan: nn.Module, spec: dict) -> dict[str, bytes]:
    """Every phase of `spec` captured on inputs of the spec's batch (the shapes a run gives
    it), as the archive's entries `ganc_joint/PHASE.pt` (`ganc train --executor joint` runs
    them); with stages, once per stage with the stage attributes set to its index, as
    `ganc_joint/PHASE@STAGE.pt`. A phase that hands values on, and synchronised batch norm,
    are refused for now."""
    if spec.get("sync_batch_norm"):
        raise ExportError(f"ganc.export(joint=True): 'sync_batch_norm' ({', '.join(spec['sync_batch_norm'])}) "
                          "is not captured yet (a joint graph would hold each rank's own batch statistics); "
                          "export it without joint=True")
    stages = spec.get("stages")
    saved = {}
    if stages:
        for path in stages["attributes"]:
            owner, _, attribute = path.rpartition(".")
            saved[path] = getattr(gan.get_submodule(owner) if owner else gan, attribute)
    entries = {}
    try:
        for index, stage in enumerate(stages["list"] if stages else [None]):
            if stage is not None:
                _set_stage(gan, spec, index)
            for phase in spec["phases"]:
                if "updates" not in phase:
                    raise ExportError(f"ganc.export(joint=True): phase {phase['name']!r} is a section: sections are "
                                      "not captured yet; export it without joint=True")
                graph = capture(gan, phase, example_inputs(spec, phase),
                                phase.get("precision", spec.get("precision", "float32")))
                buffer = io.BytesIO()
                to_file(graph, buffer)
                key = phase["name"] if stage is None else f"{phase['name']}@{stage['name']}"
                entries[f"ganc_joint/{key}.pt"] = buffer.getvalue()
    finally:
        for path, value in saved.items():
            owner, _, attribute = path.rpartition(".")
            setattr(gan.get_submodule(owner) if owner else gan, attribute, value)
    return entries
