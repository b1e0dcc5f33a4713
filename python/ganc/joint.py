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

import contextlib
import io
import json
import math
import operator
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.utils.stateless import _reparametrize_module
from torch.overrides import TorchFunctionMode

from . import oplibs
from .phases import autocast, example_inputs, phase_loss
from .probe import raised_at
from .scriptable import ExportError

__all__ = ["ARCHIVE_VERSION", "JOINT_VERSION", "JointGraph", "archive_entries", "capture", "capture_sample",
           "to_file", "write_archive"]

JOINT_VERSION = 1
# ganc's own archive (write_archive): no TorchScript code, docs/export.md "Without TorchScript".
ARCHIVE_VERSION = 1


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
    # The autocast precision and the batch the phase was captured under ("" and 0 for the
    # sample graph, which runs as captured).
    precision: str = ""
    batch: int = 0
    # The grouped convolutions captured as ganc::convolution (GroupedConvolutions); -1: with
    # PyTorch's double backward (ganc's operators were not loaded).
    grouped_convolutions: int = -1

    @property
    def used(self) -> list[str]:
        """The parameters whose gradient the phase computes, in the gan's order."""
        return [name for kind, name in self.outputs if kind == "gradient"]


# The convolutions a phase may call with groups, by their Python functions: (spatial dims,
# transposed, their arguments after input and weight in order).
_CONVOLUTIONS = {
    **{getattr(torch.nn.functional, f"conv{n}d"): (n, False, ("bias", "stride", "padding", "dilation", "groups"))
       for n in (1, 2, 3)},
    **{getattr(torch.nn.functional, f"conv_transpose{n}d"):
       (n, True, ("bias", "stride", "padding", "output_padding", "groups", "dilation")) for n in (1, 2, 3)},
}


class GroupedConvolutions(TorchFunctionMode):
    """While a phase is captured: each grouped convolution it calls runs as ganc::convolution
    (with `weight_gradients` off), as `ganc train --double-backward filters` rewrites the
    TorchScript graph. Where the weight takes no gradient (StyleGAN's FIR filters) autograd then
    records ganc's double backward, whole-convolution weight-gradient kernels, where PyTorch's
    makes one convolution per group; the numbers are PyTorch's bit for bit, and a weight that
    takes a gradient keeps PyTorch's own. The graph holds ATen ops only: the op's autograd
    kernel runs them. `count` is how many calls it took."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        how = _CONVOLUTIONS.get(func)
        if how is None:
            return func(*args, **kwargs)
        dims, transposed, names = how
        given = dict(zip(("input", "weight") + names, args), **kwargs)
        x, w = given.get("input"), given.get("weight")
        groups = given.get("groups", 1)
        if (not isinstance(x, torch.Tensor) or not isinstance(groups, int) or groups == 1
                or isinstance(given.get("padding", 0), str) or x.dim() != dims + 2):
            return func(*args, **kwargs)

        def each(name, default):
            value = given.get(name, default)
            return [int(value)] * dims if isinstance(value, int) else [int(v) for v in value]
        self.count += 1
        return torch.ops.ganc.convolution(x, w, given.get("bias"), each("stride", 1), each("padding", 0),
                                          each("dilation", 1), transposed, each("output_padding", 0), groups,
                                          False, f"aten::{func.__name__}")


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

    grouped = contextlib.nullcontext() if not oplibs.load_ganc_ops() else GroupedConvolutions()

    def joint(p, b, inputs, seed):
        state = {**dict(zip(pnames, p)), **dict(zip(bnames, b))}
        with _reparametrize_module(gan, state, tie_weights=True):
            with autocast("cpu", precision), grouped:
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
    graph = JointGraph(phase["name"], phase["method"], module, precision=precision,
                       grouped_convolutions=grouped.count if isinstance(grouped, GroupedConvolutions) else -1,
                       batch=next((a.shape[0] for a in inputs if isinstance(a, torch.Tensor) and a.dim()), 0))
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
    listed = {"ganc_joint": JOINT_VERSION, "phase": graph.phase, "method": graph.method,
              "inputs": inputs, "nodes": nodes, "outputs": outputs}
    if graph.precision:  # what a run must match to run the graph
        listed.update(precision=graph.precision, batch=graph.batch)
    if graph.grouped_convolutions >= 0:
        listed.update(grouped_convolutions=graph.grouped_convolutions)
    return listed


def to_file(graph: JointGraph, path) -> None:
    """Writes the captured phase as ganc's op list with its constants (docs/ir.md); `path` may
    be a file object."""
    torch.save({"graph": json.dumps(op_list(graph)), "constants": graph.constants}, path)


def _set_stage(gan: nn.Module, spec: dict, index: int) -> None:
    for path in spec["stages"]["attributes"]:
        owner, _, attribute = path.rpartition(".")
        setattr(gan.get_submodule(owner) if owner else gan, attribute, index)


def _first_line(e: Exception) -> str:
    """The first line of what `e` says, without the export's own prefix."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    for prefix in ("ganc.export: ", "ganc.joint: "):
        line = line[len(prefix):] if line.startswith(prefix) else line
    return line


def _advised(text: str, advice: str) -> str:
    return f"{text}; {advice}" if advice else text


def captured(gan: nn.Module, spec: dict, refused: list | None = None, advice: str = ""):
    """Every phase of `spec` captured on inputs of the spec's batch (the shapes a run gives
    it), as (key, JointGraph); with stages, once per stage with the stage attributes set to
    its index, keyed `PHASE@STAGE`. A phase the capture cannot take (a section, one that takes
    or hands on values of other phases, a branch on a tensor value) raises ExportError, or, with
    `refused` (a list), is left out and (phase name, why) appended there. Synchronised batch
    norm is refused for the whole spec. `advice` ends the refusals' lines."""
    if spec.get("sync_batch_norm"):
        raise ExportError(_advised(f"ganc.export: 'sync_batch_norm' ({', '.join(spec['sync_batch_norm'])}) is not "
                                   "captured yet (a joint graph would hold each rank's own batch statistics)", advice))
    stages = spec.get("stages")
    saved = {}
    if stages:
        for path in stages["attributes"]:
            owner, _, attribute = path.rpartition(".")
            saved[path] = getattr(gan.get_submodule(owner) if owner else gan, attribute)
    graphs = []
    try:
        for index, stage in enumerate(stages["list"] if stages else [None]):
            if stage is not None:
                _set_stage(gan, spec, index)
            for phase in spec["phases"]:
                try:
                    graph = _capture_phase(gan, spec, phase, advice)
                except Exception as e:  # noqa: BLE001 - with `refused`, any failure leaves the phase out
                    if refused is None:
                        raise
                    if all(name != phase["name"] for name, _ in refused):
                        refused.append((phase["name"], _first_line(e)))
                    continue
                graphs.append((phase["name"] if stage is None else f"{phase['name']}@{stage['name']}", graph))
    finally:
        for path, value in saved.items():
            owner, _, attribute = path.rpartition(".")
            setattr(gan.get_submodule(owner) if owner else gan, attribute, value)
    return graphs


def _capture_phase(gan: nn.Module, spec: dict, phase: dict, advice: str) -> JointGraph:
    if "updates" not in phase:
        raise ExportError(_advised(f"ganc.export: phase {phase['name']!r} is a section: sections are not captured "
                                   "yet", advice))
    taken = [i["output"] for i in phase["inputs"] if i["source"] == "output"]
    if taken:
        raise ExportError(_advised(f"ganc.export: phase {phase['name']!r} takes {', '.join(taken)} from another "
                                   "phase: phases that take values of others are not captured yet", advice))
    return capture(gan, phase, example_inputs(spec, phase), phase.get("precision", spec.get("precision", "float32")))


def archive_entries(gan: nn.Module, spec: dict, refused: list | None = None, advice: str = "") -> dict[str, bytes]:
    """Every phase captured (`captured`, `refused` and `advice` as there), as a TorchScript
    archive's entries `ganc_joint/KEY.pt` (`ganc train` runs them with ganc's executor)."""
    entries = {}
    for key, graph in captured(gan, spec, refused, advice):
        buffer = io.BytesIO()
        to_file(graph, buffer)
        entries[f"ganc_joint/{key}.pt"] = buffer.getvalue()
    return entries


def _stored(graph: JointGraph) -> dict:
    return {"graph": json.dumps(op_list(graph)), "constants": graph.constants}


def capture_sample(gan: nn.Module, spec: dict) -> JointGraph:
    """The sample grid's call (the spec's `sample`: a submodule on noise, or a method on its
    inputs) captured as a graph of ATen ops on a training batch of its inputs, without
    gradients, in eval mode (or, with `mode: train`, in training mode; the runtime puts the
    buffers back after it). Its outputs are the images, kind `sample`, one per tensor the call
    returns."""
    sample = spec["sample"]
    batch = spec["batch_size"]
    dtype = getattr(torch, spec.get("dtype", "float32"))
    if "method" in sample:
        args = list(example_inputs(spec, {"name": "sample", "inputs": sample["inputs"]}, batch))
        names = [i["name"] for i in sample["inputs"]]
        owner, call, mode = gan, getattr(gan, sample["method"]), sample.get("mode", "eval")
    else:
        args = [torch.randn([batch] + list(sample["noise_shape"])).to(dtype)]
        names = ["noise"]
        if sample.get("classes"):
            args.append(torch.arange(batch) % sample["classes"])
            names.append("labels")
        owner = gan.get_submodule(sample["submodule"])
        call, mode = owner, "eval"
    params = dict(gan.named_parameters())
    buffers = dict(gan.named_buffers())
    pnames, bnames = list(params), list(buffers)
    count = []

    def draw(p, b, inputs):
        state = {**dict(zip(pnames, p)), **dict(zip(bnames, b))}
        with _reparametrize_module(gan, state, tie_weights=True), torch.no_grad():
            out = call(*inputs)
        images = list(out) if isinstance(out, tuple) else [out]
        if not images or not all(isinstance(t, torch.Tensor) for t in images):
            raise ExportError(f"ganc.export: spec sample: the call returned {type(out).__name__}, not a tensor or "
                              "a tuple of tensors")
        count[:] = [len(images)]
        return images

    modes = {name: m.training for name, m in gan.named_modules()}
    owner.train(mode == "train")
    try:
        module = make_fx(draw)([t.detach().clone() for t in params.values()],
                               [t.detach().clone() for t in buffers.values()], [a.clone() for a in args])
    except RuntimeError as e:
        if "tracing tensor" not in str(e) and "data-dependent" not in str(e):
            raise
        raise ExportError(f"ganc.export: spec sample: a Python value read from a tensor "
                          f"({raised_at(e) or '<unknown>'}) decides what runs, which a graph cannot hold") from None
    finally:
        for name, m in gan.named_modules():
            m.training = modes[name]
    graph = JointGraph("sample", sample.get("method", sample.get("submodule", "")), module)
    graph.inputs = ([("parameter", n) for n in pnames] + [("buffer", n) for n in bnames]
                    + [("input", n) for n in names])
    graph.outputs = [("sample", str(i)) for i in range(count[0])]
    graph.constants = {name: getattr(module, name).detach().clone() for name in _constants(module)}
    return graph


def _library_ops(graphs: list, libraries: list, calls: dict | None) -> str | None:
    """ganc_ops.json's text for the operators the graphs call from operator libraries (None
    for none); ExportError where no library was given for one."""
    from .oplibs import backward_reads
    used = sorted({node["op"] for graph in graphs for node in graph["nodes"]
                   if "::" in node["op"] and node["op"].split("::")[0] not in ("aten", "prims")})
    if not used:
        return None
    if not libraries:
        raise ExportError(f"ganc.export: the phases call the operator {used[0]}, which no library in op_libraries "
                          "provides: pass the TORCH_LIBRARY shared library that registers it")
    needs = {"libraries": [os.path.basename(p) for p in libraries], "ops": used}
    measured = {op: backward_reads(*calls[op]) for op in used if op in (calls or {})}
    if measured:
        needs["backward_reads"] = measured
    return json.dumps(needs, indent=1)


def write_archive(gan: nn.Module, path, spec: dict, spec_text: str, libraries=(), calls=None) -> None:
    """Writes ganc's own archive of `gan` (no TorchScript code): a torch.save container of
    the spec, the parameters and buffers by their state-dict names, the int attributes the
    spec's stages set, every phase's joint graph (`captured`) and the sample grid's graph
    (`capture_sample`), as docs/export.md's "Without TorchScript" describes it, with
    ganc_ops.json's text where the graphs call operators of `libraries` (`calls`: what the
    export's recorder saw of them)."""
    stages = spec.get("stages")
    attributes = {}
    for attribute in (stages["attributes"] if stages else []):
        owner, _, name = attribute.rpartition(".")
        attributes[attribute] = int(getattr(gan.get_submodule(owner) if owner else gan, name))
    archive = {
        "ganc_archive": ARCHIVE_VERSION,
        "spec": spec_text,
        "parameters": {n: t.detach().clone() for n, t in gan.named_parameters()},
        "frozen": [n for n, t in gan.named_parameters() if not t.requires_grad],
        "buffers": {n: t.detach().clone() for n, t in gan.named_buffers()},
        # Each module's own tensors, then its submodules', as PyTorch lists them.
        "order": [f"{prefix}.{n}" if prefix else n for prefix, m in gan.named_modules()
                  for n, t in [*m._parameters.items(), *m._buffers.items()] if t is not None],
        "attributes": attributes,
        "joint": {key: _stored(graph) for key, graph in
                  captured(gan, spec, advice="export it with TorchScript (ganc.export's default)")},
    }
    if spec.get("sample"):
        archive["sample"] = _stored(capture_sample(gan, spec))
    ops = _library_ops([json.loads(g["graph"]) for g in archive["joint"].values()], list(libraries), calls)
    if ops:
        archive["ops"] = ops
    torch.save(archive, path)
