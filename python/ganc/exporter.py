"""Exporting a GAN and its phases to a ganc archive (ganc.export), and reading back what
ganc wrote (ganc.load_spec, ganc.load_checkpoint)."""
from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import sys
import warnings
import zipfile
import zlib

import torch

from . import functions, oplibs
from .hooks import refuse_gradient_hooks, refuse_shared_parameters
from .hybrid import Resolver, script_error, fresh_types_on_failure, script_failure
from .probe import Probe
from .script_types import constants_typed
from .trace_derivatives import rng_kept
from .scriptable import ExportError, make_scriptable, python_call, sync_batch_norm_paths
from .phases import example_inputs, phase_loss
from .spec import SPEC_VERSION, SpecError, dumps, validate

__all__ = ["export", "load_spec", "load_checkpoint", "example_inputs", "run_phases", "phase_methods_scripted"]


def run_phases(model, spec: dict, batch: int | None = None, before=None):
    """Calls every phase method of `model` once, in spec order, on example inputs, handing
    each phase's `outputs` to the phases that take them; yields (phase, arguments, output).
    `before(phase)` is called before each phase method."""
    values = {}
    for phase in spec["phases"]:
        args = example_inputs(spec, phase, batch, values)
        if before is not None:
            before(phase["name"])
        out = getattr(model, phase["method"])(*args)
        yield phase, args, out
        handed = phase_values(out, phase)
        values.update({f"{phase['name']}.{k}": handed[k] for k in phase.get("outputs", [])})


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
        with constants_typed(type(gan)) if script else contextlib.nullcontext():
            yield
    finally:
        for fn, old in saved:
            if old is _MISSING:
                fn.__dict__.pop("_torchscript_modifier", None)
            else:
                fn._torchscript_modifier = old


_MISSING = object()


_JIT_DEPRECATION = re.compile(r"`torch\.jit\.\w+` is deprecated")
_jit_noted = False


@contextlib.contextmanager
def _jit_deprecation_noted():
    """torch's FutureWarnings that torch.jit is deprecated (one per scripted or traced piece,
    from torch 2.15) become one line of ganc's own, once per process; other warnings pass
    through as they were."""
    global _jit_noted
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    deprecated = False
    for w in caught:
        if issubclass(w.category, FutureWarning) and _JIT_DEPRECATION.search(str(w.message)):
            deprecated = True
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if deprecated and not _jit_noted:
        _jit_noted = True
        print(f"ganc.export: note: torch {torch.__version__.split('+')[0]} deprecates TorchScript "
              "(torch.jit), the format of ganc's archives; it still works there, and ganc's "
              "supported torch versions are listed in docs/install.md", file=sys.stderr)


def export(gan: torch.nn.Module, path: str, spec: dict, trace: bool = False, verbose: bool = True,
           op_libraries=(), joint: bool | None = None, torchscript: bool | None = None) -> dict:
    """Exports `gan` with every phase method and its spec to the archive `path`.

    By default the export is hybrid (see ganc.hybrid): the phase methods are scripted, and each
    submodule that does not script is traced alone at the calls the phases make, checked
    against eager, and stitched in. `trace=True` traces every phase method whole (no gradient
    penalties). torch.autograd.Functions inside traced networks go in through their forward's
    operations once their backward is checked against the derived gradient (ganc.functions).
    Spectral norm and weight norm layers (both PyTorch APIs) are exported through scriptable
    equivalents with the same state_dict names and numerics (see ganc.scriptable). `gan`
    itself is not modified: the probes and the export run on a copy, and the archive holds the
    parameters and buffers `gan` had. With `verbose`, one line per traced submodule, container
    and Function says what became of it and why.

    Each phase is also captured as one joint graph of ATen ops (forward, its `autograd.grad`
    calls and the parameter gradients; see ganc.joint), kept in the archive, which `ganc train`
    runs on the CPU with ganc's own executor in place of TorchScript and autograd; a spec with
    stages gets one graph per phase and stage. By default (`joint=None`) a phase the capture
    cannot take (a section, one taking values of others, a branch on a tensor value; every
    phase with `sync_batch_norm`) keeps TorchScript alone, said in one line; `joint=True` makes
    that an error, `joint=False` captures nothing.

    `op_libraries`: paths of TORCH_LIBRARY operator libraries (shared libraries) whose
    operators the model calls; they are loaded here and named in the archive, and `ganc
    compile` / `ganc train` need them too (`--op-library`).

    `torchscript=False`: the archive is ganc's own, with no TorchScript code (docs/export.md,
    "Without TorchScript"): the spec, the parameters and buffers, each phase's joint graph and
    the sample grid's graph in one torch.save container. Nothing of torch.jit is called, so it
    works where TorchScript is unavailable; `ganc train` runs it through ganc's executor. By
    default (`torchscript=None`) the archive is TorchScript's where torch.jit works, and ganc's
    own, said in one line, where it does not (a PyTorch or a Python without TorchScript);
    `torchscript=True` insists on TorchScript.

    Returns the validated spec. Raises SpecError for a spec that names a method or submodule
    that does not exist or a phase that does not return a scalar, and ExportError, naming the
    submodule and file:line, for code ganc cannot export.
    """
    if not isinstance(gan, torch.nn.Module):
        raise TypeError(f"ganc.export: the GAN must be a torch.nn.Module, not {type(gan).__name__}")
    if torchscript is None or torchscript:
        unavailable = _torchscript_unavailable()
        if unavailable and torchscript:
            raise ExportError(f"ganc.export(torchscript=True): TorchScript is unavailable here ({unavailable}); "
                              "export with torchscript=False (ganc's own archive)")
        if unavailable:
            if verbose:
                print(f"ganc.export: TorchScript is unavailable here ({unavailable}): writing ganc's own "
                      "archive (torchscript=False), which ganc train runs through ganc's executor")
        torchscript = not unavailable
    if not torchscript:
        if trace:
            raise ValueError("ganc.export: trace=True makes a TorchScript archive; it cannot go with "
                             "torchscript=False")
        return _export_without_torchscript(gan, path, spec, op_libraries)
    with _jit_deprecation_noted():
        return _export(gan, path, spec, trace, verbose, op_libraries, joint)


def _torchscript_unavailable() -> str:
    """Why torch.jit cannot script here (the first line of its error on a one-line function),
    or "" where it can: a PyTorch built without TorchScript, or a Python it does not support."""
    def probe(x: torch.Tensor) -> torch.Tensor:
        return x + 1
    try:
        with _jit_deprecation_noted():
            torch.jit.script(probe)
    except Exception as e:  # noqa: BLE001 - whatever torch.jit raises, TorchScript is not there
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    return ""


def _export_without_torchscript(gan, path, spec, op_libraries) -> dict:
    """ganc's own archive (ganc.joint.write_archive): every phase's joint graph and the sample
    grid's graph, captured on a copy of `gan`, with its parameters, buffers and spec."""
    from . import joint as joint_graphs
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"ganc.export: {path}: the folder {folder} does not exist")
    libraries = oplibs.load(op_libraries)
    spec = _list_sync_batch_norms(validate(spec, gan), gan)
    refuse_gradient_hooks(gan)
    refuse_shared_parameters(gan)
    model = make_scriptable(gan)  # the same state-dict names and numerics; nothing is scripted
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train()
    ops = oplibs.Recorder() if libraries else contextlib.nullcontext()
    with ops:
        probe = _probe(model, spec)  # each phase returns a scalar loss; what a graph would freeze
    _restore(model, state)
    frozen = _frozen_by_capture(probe)
    if frozen:
        raise ExportError(f"ganc.export(torchscript=False): {frozen}; export it with TorchScript (ganc.export's "
                          "default), which keeps it")
    with rng_kept():
        joint_graphs.write_archive(model, path, spec, dumps(spec), libraries,
                                   ops.calls if libraries else None)
    return spec


def _export(gan, path, spec, trace, verbose, op_libraries, joint=None) -> dict:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):  # said before the scripting, not by torch.jit.save after it
        raise FileNotFoundError(f"ganc.export: {path}: the folder {folder} does not exist")
    libraries = oplibs.load(op_libraries)
    spec = _list_sync_batch_norms(validate(spec, gan), gan)
    refuse_gradient_hooks(gan)
    refuse_shared_parameters(gan)
    model = make_scriptable(gan)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train()
    # Where every network scripts, nothing is traced: the probe only checks the phases' losses,
    # at a small batch (as exports always did); otherwise it records the calls to trace at.
    scripts = not trace and all(script_error(child) is None for child in model.children())
    ops = oplibs.Recorder() if libraries else contextlib.nullcontext()
    with ops:
        probe = _probe(model, spec, batch=2 if scripts else None, whole=trace)
        if scripts and any(_methods_called(probe, name) and script_error(child, _methods_called(probe, name))
                           for name, child in model.named_children()):
            # A method a phase calls (besides forward) does not script: that network is traced,
            # at the calls of the spec's batch.
            _restore(model, state)
            probe = _probe(model, spec, whole=trace)
    _restore(model, state)
    lines = functions.check_all(probe.functions.applied.values())
    graphs = {}
    frozen = _frozen_by_capture(probe) if joint is not False else None
    if frozen and joint:
        raise ExportError(f"ganc.export(joint=True): {frozen}; export it with joint=False")
    if frozen:
        lines.append(f"joint graphs: none (every phase runs through TorchScript): {frozen}")
    elif joint is not False:  # captured on the module the archive's names come from, left as it was
        from . import joint as joint_graphs
        refused = None if joint else []
        try:
            graphs = joint_graphs.archive_entries(model, spec, refused,
                                                  "export it with joint=False" if joint else "")
        except Exception as e:  # noqa: BLE001 - by default, what the capture cannot take keeps TorchScript
            if joint:
                raise
            lines.append(f"joint graphs: none (every phase runs through TorchScript): {joint_graphs._first_line(e)}")
        lines += [f"phase {name!r}: no joint graph (it runs through TorchScript): {why}" for name, why in refused or []]
        _restore(model, state)
    names = [p["method"] for p in spec["phases"]]
    names += [spec["sample"]["method"]] if "method" in spec.get("sample", {}) else []  # the grid's
    if trace:
        for hazard in probe.hazards:
            advice = hazard.advice or ("a trace would freeze it, the same every step; draw random numbers with "
                                       "torch and keep tensor values in tensors, or export without trace=True")
            raise ExportError(f"ganc.export: {hazard.path or type(gan).__name__} ({hazard.where}): "
                              f"{hazard.construct} in a phase traced whole (trace=True): {advice}")
        scripted = _trace_whole(model, spec, names)
    else:
        scripted, lines = _script_stitched(model, gan, probe, names, lines)
    _restore(scripted, state)
    extra = {"ganc.json": dumps(spec), **graphs}
    needs = oplibs.requirements(scripted, libraries, ops.calls if libraries else None)
    if needs:
        extra["ganc_ops.json"] = needs
    if verbose:
        for line in lines:
            print(f"ganc.export: {line}")
    torch.jit.save(scripted, path, _extra_files=extra)
    return spec


def _frozen_by_capture(probe: Probe) -> str | None:
    """What the probe saw that a joint graph would freeze (a NumPy or Python random draw, a
    tensor's value read into Python, a parameter read as a value or changed in place, a tensor
    hook), said as a refusal; None where it saw nothing."""
    if not probe.hazards:
        return None
    h = probe.hazards[0]
    return f"{h.construct} in {h.path or 'a phase method'} ({h.where}) would be the same every step in a joint graph"


def _trace_whole(model, spec, names):
    """`trace=True`: every phase method traced whole, then run once forward and backward."""
    with phase_methods_scripted(model, names, script=False), fresh_types_on_failure(), \
            functions.derived(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        methods = {p["method"]: args for p, args, _ in run_phases(model, spec)}
        # strict=False: a phase may return a dict of logged values besides its loss.
        scripted = torch.jit.trace_module(model, methods, check_trace=False, strict=False)
    _check_trace_trains(scripted, spec)
    return scripted


def _script_stitched(model, gan, probe, names, lines):
    """The hybrid export: the networks that do not script traced and stitched in (said in one
    line each, before `lines`), then the phase methods scripted over them."""
    decisions = _stitch(model, probe)
    scripted_paths = [d.path for d in decisions if d.kind == "scripted"]
    lines = ([f"scripted: {', '.join(scripted_paths)}"] if scripted_paths else []) + [
        f"{d.path}: {d.detail}" if d.kind == "traced" else f"{d.path}: {d.kind} ({d.detail})"
        for d in decisions if d.kind != "scripted"] + lines
    # Phase methods need not be decorated by the user.
    with phase_methods_scripted(model, names), fresh_types_on_failure():
        # Scripting reads every attribute, properties included: in eval mode a layer's
        # weight property runs no power iteration. The modes are set back afterwards.
        modes = {name: m.training for name, m in model.named_modules()}
        model.eval()
        try:
            scripted = torch.jit.script(model)
        except Exception as e:  # noqa: BLE001 - TorchScript's frontend raises several types
            raise ExportError(f"ganc.export: {type(gan).__name__} (the phases): {script_failure(e)}") from None
        finally:
            for name, m in model.named_modules():
                m.training = modes[name]
        for name, m in scripted.named_modules():
            m.training = modes[name]
    call = python_call(scripted)
    if call is not None:
        raise ExportError(f"ganc.export: {type(gan).__name__} (the phases): {call[0]}; call it from a "
                          "submodule's forward (ganc traces it there) or make it scriptable")
    return scripted, lines


def _methods_called(probe, path: str) -> list:
    """The methods besides forward the phases call on submodule `path`."""
    return sorted({c.method for c in probe.calls.get(path, []) if c.method != "forward"})


def _probe(model: torch.nn.Module, spec: dict, batch: int | None = None, whole: bool = False) -> Probe:
    """Runs every phase once at the spec's shapes (at `batch` instead of the spec's batch,
    when given), and the sample grid's call in eval mode, under the probe's hooks; checks
    that each phase returns a scalar loss."""
    probe = Probe(model)
    if whole:  # trace=True traces the phase methods too: what they do is watched as a network's is
        probe.stack.append("")
    with rng_kept(), probe.recording():
        torch.manual_seed(0)
        for phase, _, out in run_phases(model, spec, batch, before=probe.begin_phase):
            if phase["updates"]:
                phase_loss(out, phase)
        sample = spec.get("sample")
        probe.begin_phase("sample")
        if sample and "method" in sample:  # the grid's method, on a batch of its inputs
            args = example_inputs(spec, {"name": "sample", "inputs": sample["inputs"]}, batch)
            training = model.training
            if sample.get("mode", "eval") == "eval":
                model.eval()
            with torch.no_grad():
                getattr(model, sample["method"])(*args)
            model.train(training)
        elif sample:
            sub = model.get_submodule(sample["submodule"])
            training = sub.training
            sub.eval()
            batch = batch or spec["batch_size"]  # ganc draws the grid a training batch at a time
            args = [torch.randn([batch] + list(sample["noise_shape"])).to(getattr(torch, spec.get("dtype", "float32")))]
            if sample.get("classes"):
                args.append(torch.arange(batch) % sample["classes"])
            with torch.no_grad():
                sub(*args)
            sub.train(training)
    return probe


def _stitch(model: torch.nn.Module, probe: Probe) -> list:
    """Replaces each submodule of `model` that does not script by its trace or a container;
    returns what became of each."""
    resolver = Resolver(probe)
    decisions = []
    for name, child in list(model.named_children()):
        new, below, refusal = resolver.resolve(child, name)
        if refusal is not None:
            raise refusal
        decisions += below
        if new is not child:
            model._modules[name] = new
    return decisions


def _list_sync_batch_norms(spec: dict, gan: torch.nn.Module) -> dict:
    """The spec with every torch.nn.SyncBatchNorm layer of `gan` in `sync_batch_norm` (those
    not under a submodule it lists already): ganc runs them synchronised over the ranks, as
    they ran under DDP."""
    layers = sync_batch_norm_paths(gan)
    if not layers:
        return spec
    if spec["ganc_spec"] == 1:
        raise SpecError(f"spec: the model's torch.nn.SyncBatchNorm layers ({', '.join(layers)}) are "
                        "synchronised through 'sync_batch_norm', a ganc_spec 2 field; set \"ganc_spec\": 2")
    listed = list(spec.get("sync_batch_norm", []))
    listed += [path for path in layers if not any(path == s or path.startswith(s + ".") for s in listed)]
    return dict(spec, sync_batch_norm=listed)


def phase_values(output, phase: dict) -> dict:
    """The dict a phase method returned besides its loss: a section's whole output, the second
    element of `(loss, dict)`, else {}. Its `outputs` must be there."""
    values = output if isinstance(output, dict) else (
        output[1] if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], dict) else {})
    missing = [k for k in phase.get("outputs", []) if not isinstance(values.get(k), torch.Tensor)]
    if missing:
        raise SpecError(f"spec: phase {phase['name']!r}: method {phase['method']!r} returns no tensor "
                        f"{missing[0]!r}, one of its 'outputs'")
    return values


def _restore(module, state: dict) -> None:
    """Copies `state` (a state_dict snapshot) back into `module`'s tensors, gradients dropped."""
    with torch.no_grad():
        for name, t in module.state_dict().items():
            t.copy_(state[name])
    for p in module.parameters():
        p.grad = None


def _check_trace_trains(traced, spec: dict) -> None:
    """Runs every traced phase once with autograd: a trace that recorded ops autograd cannot
    differentiate (out= variants, in-place updates of saved tensors) is refused with the cause
    now, not at `ganc compile` or at step 0."""
    phases = run_phases(traced, spec)
    for phase in spec["phases"]:
        try:
            phase, _, out = next(phases)
            if phase["updates"]:
                phase_loss(out, phase).backward()
        except Exception as e:  # noqa: BLE001 - any failure means the archive cannot train
            cause = str(e).strip().splitlines()
            raise ExportError(f"ganc.export: phase {phase['name']!r}: the traced archive cannot train: "
                              f"{type(e).__name__}: {cause[-1] if cause else ''}") from e


def load_spec(path: str) -> dict:
    """The ganc.json stored in an archive (ValueError for a file that is not one)."""
    files = {"ganc.json": ""}
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    stored = read_ganc_archive(path)
    if stored is not None:
        import json
        return json.loads(stored["spec"])
    try:
        torch.jit.load(path, _extra_files=files)
    except RuntimeError as e:
        op = re.search(r"Unknown builtin op: (\S+)\.", str(e))
        if op:
            raise ValueError(f"{path} calls the operator {op.group(1)}: load its operator library first "
                             "(torch.ops.load_library)") from None
        raise ValueError(f"{path} is not a TorchScript archive (write one with ganc.export)") from None
    if not files["ganc.json"]:
        raise ValueError(f"{path} holds no ganc.json: it was not written by ganc.export")
    import json
    return json.loads(files["ganc.json"])


def read_ganc_archive(path: str) -> dict | None:
    """The contents of ganc's own archive (ganc.export(..., torchscript=False)), or None for
    a file that is not one (a TorchScript archive)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return None
    if any("/code/" in n for n in names) or not any(n.endswith("/data.pkl") for n in names):
        return None
    stored = torch.load(path, weights_only=True)
    return stored if isinstance(stored, dict) and "ganc_archive" in stored else None


def load_checkpoint(path: str) -> dict:
    """Loads a file ganc wrote (checkpoint.pt, gradient dumps) with torch.load, after checking
    it is whole as `ganc train --resume` does: the CRC-32 seal ganc's checkpoints carry and
    every entry's own CRC-32. A damaged file raises ValueError naming it and the damage.

    LibTorch's pickler wraps containers in `torch.jit._pickle` helpers (restore_type_tag,
    build_doublelist, ...), plain identity functions that the weights-only unpickler does not
    allow by default; allowing them keeps the load weights-only.
    `torch.load(path, weights_only=False)` also works.
    """
    return read_checkpoint(path, "ganc.load_checkpoint")


def read_checkpoint(path: str, who: str) -> dict:
    """load_checkpoint for `who`, the call its errors name."""
    check_whole(path, who)
    import torch.jit._pickle as jp
    helpers = [jp.restore_type_tag, jp.build_intlist, jp.build_tensorlist, jp.build_doublelist,
               jp.build_boollist]
    with torch.serialization.safe_globals(helpers):
        return torch.load(path, weights_only=True)


# The comment ganc's checkpoints carry (support/Files.cpp, sealZipArchive): the CRC-32 of every
# byte before it, as eight hex digits.
_SEAL = b"ganc-crc32 "
_SEAL_SIZE = len(_SEAL) + 8


def check_whole(path: str, who: str) -> None:
    """Raises ValueError (`who: path is damaged: why`) unless `path` is a whole zip archive:
    its seal, where it has one, matches the CRC-32 of the bytes before it, and every entry
    reads back with its own CRC-32 (torch records 0 where it computed none)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read below forever
            raise ValueError(f"{who}: {path}: not a regular file")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{who}: {path}: {e.strerror}") from None

    def damaged(why: str) -> ValueError:
        return ValueError(f"{who}: {path} is damaged: {why}")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as e:
        raise damaged(f"not a whole zip archive ({e})") from None
    with archive:
        if len(archive.comment) == _SEAL_SIZE:
            if not archive.comment.startswith(_SEAL):
                raise damaged("its seal (the archive's comment) is damaged")
            if archive.comment[len(_SEAL):] != b"%08x" % zlib.crc32(data[:len(data) - _SEAL_SIZE]):
                raise damaged("the file's CRC-32 does not match its seal (the file is corrupted)")
        for info in archive.infolist():
            if info.CRC == 0 or info.is_dir():
                continue
            try:
                with archive.open(info) as entry:
                    while entry.read(1 << 24):
                        pass
            except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                raise damaged(f"entry {info.filename!r}: {e}") from None
