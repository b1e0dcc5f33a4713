"""The ganc spec (ganc.json): what the phases of a GAN are and how to train them.

The schema is versioned by the integer field ``ganc_spec``; docs/spec.md documents it. Its
keys, and the version that added each, are declared once, in frontend/SpecFields.def; this
package reads them from spec_fields.json (generated from it, checked for drift by the tests).
``validate`` runs the C++ validator (``ganc spec -``, the one `ganc compile` runs) on what it
returns, so a spec ganc.export accepts is one ganc compile accepts.
"""
from __future__ import annotations

import copy
import difflib
import json
import math
import os
import subprocess

SPEC_VERSION = 2  # written by ganc.export; versions 1 and 2 are read
READ_VERSIONS = (1, 2)
_FIELDS = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "spec_fields.json")))
# Every key each object may hold; anything else is a misspelling, refused with a suggestion.
KEYS = {kind: tuple(keys) for kind, keys in _FIELDS["keys"].items()}
# Each plain value's rule (kind, bounds, names, default), as the C++ readers check it.
RULES = _FIELDS["rules"]
# Fields version 2 added; a version 1 spec using one is refused (an older ganc would ignore it).
V2_SPEC_FIELDS = tuple(_FIELDS["version"].get("spec", {}))
V2_PHASE_FIELDS = tuple(_FIELDS["version"].get("phase", {}))
V2_OPTIMIZER_FIELDS = tuple(_FIELDS["version"].get("optimizer", {}))
PRECISIONS = tuple(RULES["spec"]["precision"]["names"])
SOURCES = tuple(RULES["input"]["source"]["names"])
OPTIMIZERS = tuple(RULES["optimizer"]["type"]["names"])
# The settings of one optimizer type; another type refuses them.
VARIANT_SETTINGS = {"amsgrad": ("adam", "adamw"), "nesterov": ("sgd",), "dampening": ("sgd",),
                    "alpha": ("rmsprop",), "centered": ("rmsprop",)}
BUFFER_POLICIES = tuple(RULES["spec"]["buffers"]["names"])
DTYPES = tuple(RULES["spec"]["dtype"]["names"])


def default(kind: str, key: str):
    """The default of `kind`'s `key`, from the schema."""
    return copy.deepcopy(RULES[kind][key]["default"])


def _known_keys(obj, kind: str, where: str) -> None:
    """Every key of `obj` is one of `kind`'s (a misspelling is refused with a suggestion), and
    every value is within its rule."""
    if not isinstance(obj, dict):
        return
    for key in obj:
        if key not in KEYS[kind]:
            close = difflib.get_close_matches(key, KEYS[kind], n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SpecError(f"{where}unknown key {key!r}{hint}")
        rule = RULES.get(kind, {}).get(key)
        if rule is not None and not _obeys(rule, obj[key]):
            got = json.dumps(obj[key], separators=(",", ":"))
            raise SpecError(f"{where}{key!r} must be {rule['text']}, got {got}")


def _within(rule: dict, v) -> bool:
    if not _is_number(v) or (rule["kind"] == "integer" and not _is_integer(v)):
        return False
    low, high = rule.get("low", -math.inf), rule.get("high", math.inf)
    return ((v > low) if rule.get("low_strict") else (v >= low)) and \
        ((v < high) if rule.get("high_strict") else (v <= high))


def _obeys(rule: dict, v) -> bool:
    """`v` within a rule of spec_fields.json (the C++ reader's checkValue)."""
    kind = rule["kind"]
    if kind == "boolean":
        return isinstance(v, bool)
    if kind == "text":
        return isinstance(v, str) and bool(v)
    if kind == "choice" or isinstance(v, str):
        return isinstance(v, str) and v in rule.get("names", ())
    if rule.get("count"):
        return isinstance(v, list) and len(v) == rule["count"] and all(_within(rule, x) for x in v)
    return _within(rule, v)


class SpecError(ValueError):
    """A spec that ganc cannot compile; the message names the offending field."""


def _is_integer(v) -> bool:
    """A JSON integer (Python's bool is an int; JSON's true is not a number to the C++ reader)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    """A finite JSON number (Python's json writes NaN and Infinity, which the C++ reader refuses)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_path(v) -> bool:
    """A dotted attribute path ("discriminator.head", "logit_scale")."""
    return isinstance(v, str) and bool(v) and all(part and all(c.isalnum() or c == "_" for c in part)
                                                  for part in v.split("."))


def within(name: str, path: str) -> bool:
    """`name` is `path` or lies inside it ("generator.mapping.0.weight" in "generator")."""
    return name == path or name.startswith(path + ".")


def _validate_variant(opt: dict, where: str) -> None:
    """amsgrad; nesterov and dampening; alpha and centered: each only for its type, as the C++
    reader checks them; clamp_weights for any."""
    for key, types in VARIANT_SETTINGS.items():
        _require(key not in opt or opt["type"] in types,
                 f"{where}: {key!r} is a setting of {' and '.join(types)}, not of {opt['type']}")
    _require(not opt.get("nesterov") or (opt.get("momentum", 0) > 0 and opt.get("dampening", 0) == 0),
             f"{where}: nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)")
    if opt["type"] == "rmsprop":
        opt.setdefault("alpha", default("optimizer", "alpha"))
        opt.setdefault("eps", default("optimizer", "eps"))


def _normalise_optimizer(group: str, opt: dict) -> dict:
    """Checks one optimizer group's settings and fills in torch.optim's defaults."""
    where = f"spec: optimizer of {group!r}"
    _require("type" in opt, f"{where} needs a 'type'")
    opt.setdefault("lr", 2e-4 if opt["type"] in ("adam", "adamw") else 1e-2)
    if opt["type"] in ("adam", "adamw"):
        opt.setdefault("betas", default("optimizer", "betas"))
        opt.setdefault("eps", default("optimizer", "eps"))
        opt.setdefault("weight_decay", 0.0 if opt["type"] == "adam" else 1e-2)
    else:
        opt.setdefault("momentum", default("optimizer", "momentum"))
        opt.setdefault("weight_decay", 0.0)
    _validate_variant(opt, where)
    if "clip_grad_norm" in opt:
        _validate_clip(opt["clip_grad_norm"], where)
    if "lr_schedule" in opt:
        _validate_schedule(opt["lr_schedule"], where)
    return opt


# Each schedule type: its torch.optim.lr_scheduler class and the keyword arguments it takes.
SCHEDULES = {
    "constant": ("ConstantLR", ("factor", "total_iters")),
    "linear": ("LinearLR", ("start_factor", "end_factor", "total_iters")),
    "step": ("StepLR", ("step_size", "gamma")),
    "cosine": ("CosineAnnealingLR", ("t_max", "eta_min")),
    "exponential": ("ExponentialLR", ("gamma",)),
}
# The argument a schedule type cannot do without.
SCHEDULE_NEEDS = {"step": "step_size", "cosine": "t_max", "exponential": "gamma"}


def _validate_schedule(schedule, where: str) -> None:
    at = f"{where}: lr_schedule: "
    _require(isinstance(schedule, dict) and schedule.get("type") in SCHEDULES,
             f"{at}unknown type {schedule.get('type') if isinstance(schedule, dict) else schedule!r} "
             f"({', '.join(SCHEDULES)})")
    keys = ("type",) + SCHEDULES[schedule["type"]][1]
    for key in schedule:
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            _require(False, f"{at}unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    _known_keys(schedule, "schedule", at)
    needed = SCHEDULE_NEEDS.get(schedule["type"])
    _require(needed is None or needed in schedule, f"{at}{schedule['type']} needs {needed!r}")


def lr_scheduler(optimizer, schedule: dict):
    """The torch.optim.lr_scheduler a spec's `lr_schedule` is (the eager reference)."""
    import torch
    name, keys = SCHEDULES[schedule["type"]]
    kwargs = {("T_max" if k == "t_max" else k): schedule[k] for k in keys if k in schedule}
    return getattr(torch.optim.lr_scheduler, name)(optimizer, **kwargs)


def optimizer_settings(spec: dict, group: str) -> dict:
    """A group's normalised settings; a default group (one `optimizer_groups` adds for an
    `updates` path no declared group covers) gets torch.optim.Adam's, as `ganc compile` does."""
    declared = spec.get("optimizers", {}).get(group)
    return declared if declared is not None else _normalise_optimizer(group, {"type": "adam"})


def optimizer_groups(spec: dict, names) -> dict:
    """{group: [parameter names, in model order]} for the parameters the phases train, as
    `ganc compile` resolves them: `updates` and `params` paths name parameters or submodules,
    a parameter belongs to one declared group, and a trained parameter no group declares joins
    a default group named by the (broadest) `updates` path that covers it. Every group must
    step something a phase trains. `names`: the module's parameter names, in order."""
    names = list(names)
    trained = set()
    for phase in spec["phases"]:
        for path in phase["updates"]:
            inside = [n for n in names if within(n, path)]
            _require(inside, f"spec: phase {phase['name']!r}: updates {path!r}, which names no parameter "
                             "or submodule with parameters")
            trained.update(inside)
    group_of = {}
    for group, opt in spec.get("optimizers", {}).items():
        for path in opt.get("params", [group]):
            inside = [n for n in names if within(n, path)]
            _require(inside, f"spec: optimizer of {group!r}: {path!r} names no parameter or submodule "
                             "with parameters")
            for n in inside:
                _require(group_of.setdefault(n, group) == group,
                         f"spec: parameter {n!r} is in optimizer groups {group_of[n]!r} and {group!r}; "
                         "a parameter belongs to one group")
    declared = spec.get("optimizers", {})
    for path in sorted({u for p in spec["phases"] for u in p["updates"]}, key=lambda u: (len(u), u)):
        for n in names:
            if within(n, path) and n not in group_of:
                _require(path not in declared or declared[path].get("params", [path]) == [path],
                         f"spec: parameter {n!r} is trained but in no optimizer group")
                group_of[n] = path
    groups = {}
    for n in names:
        if n in group_of and n in trained:
            groups.setdefault(group_of[n], []).append(n)
    for group in declared:
        _require(group in groups, f"spec: optimizer of {group!r} steps no parameter that a phase trains")
    return dict(sorted(groups.items()))


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise SpecError(message)


def sample_shape(spec: dict, field: str | None = None) -> list:
    """One sample's shape: `data.shape`, or with `data.fields` the named field's, or (no
    field named) the fields packed along their first dimension, as ganc keeps them."""
    fields = spec["data"].get("fields")
    if not fields:
        return list(spec["data"]["shape"])
    if field is not None:
        return list(next(f["shape"] for f in fields if f["name"] == field))
    return [sum(f["shape"][0] for f in fields)] + list(fields[0]["shape"][1:])


def field_of(spec: dict, field: str | None, samples):
    """A `data` input's tensor from a batch of packed samples: its field's channels (as a
    tensor of its own, in the samples' memory format), or the samples without a field."""
    if not field:
        return samples
    offset = 0
    for f in spec["data"]["fields"]:
        if f["name"] == field:
            import torch
            part = samples.narrow(1, offset, f["shape"][0])
            channels_last = samples.dim() == 4 and samples.is_contiguous(memory_format=torch.channels_last)
            return part.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        offset += f["shape"][0]
    raise KeyError(field)


def pack_fields(spec: dict, data: dict):
    """A data file's dict of field tensors packed along dimension 1, in the spec's order."""
    import torch
    return torch.cat([data[f["name"]] for f in spec["data"]["fields"]], 1)


def validate(spec: dict, module=None) -> dict:
    """Checks `spec` (and, given the module, that methods and submodules exist).

    Returns a normalised copy with defaults filled in.
    """
    spec = copy.deepcopy(spec)
    v1 = _validate_model_wide(spec, module)
    updated = _validate_phases(spec, module, v1)
    _validate_optimizers(spec, updated, v1, module)
    _validate_sampling(spec, updated, module)
    check_with_compiler(spec)
    return spec


def _validate_model_wide(spec: dict, module) -> bool:
    """The top-level fields, data, synchronised batch norm and loss scalers; True for a
    version 1 spec."""
    _require(isinstance(spec, dict), "spec: must be a JSON object")
    _known_keys(spec, "spec", "spec: ")
    _require(spec.get("ganc_spec") in READ_VERSIONS and _is_integer(spec.get("ganc_spec")),
             f"spec: 'ganc_spec' must be one of {READ_VERSIONS}, got {spec.get('ganc_spec')!r}")
    v1 = spec["ganc_spec"] == 1
    for field in V2_SPEC_FIELDS:
        _require(not (v1 and field in spec), f"spec: {field!r} is a ganc_spec 2 field; set \"ganc_spec\": 2")
    if not v1:  # a version 1 spec is written back as it was: no version 2 defaults
        spec.setdefault("precision", default("spec", "precision"))
    _require("name" in spec, "spec: missing 'name' (the model's name)")
    _require("batch_size" in spec, "spec: missing 'batch_size' (samples per rank per step)")
    data = spec.get("data")
    _require(isinstance(data, dict) and (isinstance(data.get("shape"), list) or "fields" in data),
             "spec: 'data' must be an object with a 'shape' list (one sample, no batch dim)")
    _known_keys(data, "data", "spec: 'data': ")
    # data.fields and data.layout are checked by the C++ validator (below, in ganc spec).
    _require("fields" in data or _positive_ints(data["shape"]),
             "spec: 'data.shape' must be a list of positive integers")
    _require(not data.get("xflip") or "fields" in data or len(data["shape"]) == 3,
             "spec: 'data.xflip' mirrors images: it needs a [C, H, W] data shape")
    spec.setdefault("dtype", default("spec", "dtype"))
    sync = spec.get("sync_batch_norm", [])
    _require(isinstance(sync, list) and all(isinstance(s, str) and s for s in sync),
             "spec: 'sync_batch_norm' must list submodule names")
    if module is not None:
        import torch
        submodules = dict(module.named_modules())  # dotted paths too ("generator.main.1"), as compile takes
        for sub in sync:
            _require(sub in submodules, f"spec: 'sync_batch_norm': {sub!r} is not a submodule")
            _require(any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in submodules[sub].modules()),
                     f"spec: 'sync_batch_norm': {sub!r} has no batch norm layer")
    scalers = spec.get("loss_scalers", {})
    _require(isinstance(scalers, dict), "spec: 'loss_scalers' must map scaler names to their settings")
    for name, scaler in scalers.items():
        _validate_scaler(name, scaler)
    return v1


def _validate_phases(spec: dict, module, v1: bool) -> set:
    """Every phase and its inputs; returns the paths the phases update."""
    data = spec["data"]
    scalers = spec.get("loss_scalers", {})
    phases = spec.get("phases")
    _require(isinstance(phases, list) and phases, "spec: 'phases' must be a non-empty list")
    names = set()
    updated = set()
    for i, phase in enumerate(phases):
        where = f"spec: phase {phase.get('name', i)!r}"
        _known_keys(phase, "phase", f"{where}: ")
        _require("name" in phase, f"{where}: needs a 'name'")
        _require(phase["name"] not in names, f"{where}: name used twice")
        names.add(phase["name"])
        _require(isinstance(phase.get("method"), str), f"{where}: needs a 'method'")
        phase.setdefault("interval", default("phase", "interval"))
        # A phase that trains nothing (no 'updates') is a section: it lists its 'outputs'.
        phase.setdefault("updates", [])
        _require(isinstance(phase["updates"], list) and (phase["updates"] or phase.get("outputs"))
                 and all(_is_path(u) for u in phase["updates"]),
                 f"{where}: 'updates' must list the submodules or parameters the phase trains (paths); "
                 "a phase that trains nothing is a section, which lists its 'outputs'")
        for field in V2_PHASE_FIELDS:
            _require(not (v1 and field in phase), f"{where}: {field!r} is a ganc_spec 2 field; "
                                                  "set \"ganc_spec\": 2")
        if not v1:
            phase.setdefault("accumulate", default("phase", "accumulate"))
            phase.setdefault("precision", spec["precision"])
        _require(phase.get("loss_scaler") is None or phase["loss_scaler"] in scalers,
                 f"{where}: 'loss_scaler' {phase.get('loss_scaler')!r} is not one of the spec's 'loss_scalers'")
        updated.update(phase["updates"])
        phase.setdefault("inputs", [])
        input_names = set()
        for inp in phase["inputs"]:
            _require(isinstance(inp.get("name"), str), f"{where}: an input has no 'name'")
            _require(inp["name"] not in input_names, f"{where}: input {inp['name']!r} is declared twice")
            input_names.add(inp["name"])
            _known_keys(inp, "input", f"{where}: input {inp['name']!r}: ")
            _require("source" in inp, f"{where}: input {inp['name']!r} needs a 'source'")
            if inp["source"] in ("labels", "categorical"):
                classes = inp.get("classes", data.get("classes", 0))
                _require(classes > 0,
                         f"{where}: input {inp['name']!r} needs 'classes' (or 'data.classes')")
                _require(inp["source"] != "labels" or data.get("classes", 0) > 0,
                         f"{where}: input {inp['name']!r} reads labels: set 'data.classes'")
            elif inp["source"] == "controller":
                _require(inp.get("controller") in spec.get("controllers", {}),
                         f"{where}: input {inp['name']!r} reads controller {inp.get('controller')!r}, "
                         "which 'controllers' does not declare")
            elif inp["source"] == "output":
                _require(isinstance(inp.get("output"), str) and "." in inp["output"],
                         f"{where}: input {inp['name']!r} takes an earlier phase's value: set 'output' "
                         "to \"PHASE.NAME\"")
            elif inp["source"] == "fade":
                _require("stages" in spec,
                         f"{where}: input {inp['name']!r} reads the fade-in weight: declare 'stages'")
            elif inp["source"] != "data":
                _require(isinstance(inp.get("shape"), list),
                         f"{where}: {inp['source']} input {inp['name']!r} needs a 'shape' (no batch dim)")
                _require(_positive_ints(inp["shape"]),
                         f"{where}: input {inp['name']!r} shape must be a list of positive integers")
        if module is not None:
            _require(hasattr(module, phase["method"]),
                     f"{where}: method {phase['method']!r} does not exist on the module")
    for name in scalers:
        _require(any(phase.get("loss_scaler") == name for phase in phases),
                 f"spec: loss scaler {name!r} is used by no phase (name it in a phase's 'loss_scaler', or remove it)")
    return updated


def _validate_optimizers(spec: dict, updated: set, v1: bool, module) -> None:
    """The optimizer groups: their keys, paths and settings (normalised in place)."""
    opts = spec.setdefault("optimizers", {})
    _require(isinstance(opts, dict), "spec: 'optimizers' must map group names to settings")
    for group, opt in opts.items():
        where = f"spec: optimizer of {group!r}"
        _require(_is_path(group), f"spec: optimizer group {group!r}: names hold letters, digits, '_' and '.'")
        _require(isinstance(opt, dict), f"{where}: must be an object")
        _known_keys(opt, "optimizer", f"{where}: ")
        for field in V2_OPTIMIZER_FIELDS:
            _require(not (v1 and field in opt), f"{where}: {field!r} is a ganc_spec 2 field; set \"ganc_spec\": 2")
        if "params" in opt:
            _require(isinstance(opt["params"], list) and opt["params"] and all(_is_path(p) for p in opt["params"]),
                     f"{where}: 'params' must list submodule or parameter paths")
        for path in opt.get("params", [group]):
            _require(any(within(path, u) or within(u, path) for u in updated),
                     f"{where}: no phase updates {path!r} or anything in it")
        _normalise_optimizer(group, opt)
    if module is not None:  # resolves the paths; the default groups are not written back
        optimizer_groups(spec, [name for name, _ in module.named_parameters()])


def _validate_sampling(spec: dict, updated: set, module) -> None:
    """The buffer policy, EMA, stages and sample grid."""
    spec.setdefault("buffers", default("spec", "buffers"))
    ema = spec.get("ema")
    if ema is not None:
        _require(isinstance(ema, dict) and "submodule" in ema and "copy" in ema,
                 "spec: 'ema' needs 'submodule' (the trained one) and 'copy' (its average)")
        _known_keys(ema, "ema", "spec: 'ema': ")
        for field in _FIELDS["version"].get("ema", {}):
            _require(not (spec.get("ganc_spec", 1) == 1 and field in ema),
                     f"spec: 'ema': {field!r} is a ganc_spec 2 field; set \"ganc_spec\": 2")
        _require(not ema.get("rampup") or ema.get("half_life_images", 0) > 0,
                 "spec: 'ema': rampup ramps half_life_images up: give one")
        _require(not any(within(u, ema["copy"]) or within(ema["copy"], u) for u in updated),
                 f"spec: 'ema': {ema['copy']!r} is trained by a phase; it must only be averaged")
        if module is not None:
            for name in (ema["submodule"], ema["copy"]):
                _require(isinstance(getattr(module, name, None), torch_module()),
                         f"spec: 'ema': {name!r} is not a submodule")
    if "stages" in spec:
        _validate_stages(spec["stages"], module)
    controllers = spec.get("controllers", {})
    _require(isinstance(controllers, dict), "spec: 'controllers' must map names to controllers")
    for name, controller in controllers.items():
        _require(isinstance(controller, dict), f"spec: controller {name!r}: must be an object")
        _known_keys(controller, "controller", f"spec: controller {name!r}: ")
    sample = spec.get("sample")
    if sample is not None and "method" in sample:  # a method of the GAN on the inputs it names
        _known_keys(sample, "sample", "spec: 'sample': ")
        _require(isinstance(sample["method"], str) and isinstance(sample.get("inputs"), list),
                 "spec: 'sample': 'method' needs 'inputs', the method's arguments in order")
        _require(module is None or hasattr(module, sample["method"]),
                 f"spec: sample method {sample['method']!r} does not exist on the module")
    elif sample is not None:
        _known_keys(sample, "sample", "spec: 'sample': ")
        _require("submodule" in sample and isinstance(sample.get("noise_shape"), list),
                 "spec: 'sample' needs 'submodule' and 'noise_shape'")
        _require(_positive_ints(sample["noise_shape"]),
                 "spec: 'sample.noise_shape' must be a list of positive integers")
        if module is not None:
            _require(isinstance(getattr(module, sample["submodule"], None), torch_module()),
                     f"spec: sample submodule {sample['submodule']!r} does not exist")


def check_with_compiler(spec: dict) -> None:
    """Runs the C++ validator (`ganc spec -`) on `spec`: the rules `ganc compile` enforces, from
    the one schema. Where ganc's tools are not built (a source checkout before its CMake
    build), `ganc compile` runs the same validator on the archive instead."""
    from .cli import ToolsNotFound, executable
    try:
        ganc = executable("ganc")
    except ToolsNotFound:
        return
    done = subprocess.run([ganc, "spec", "-"], input=json.dumps(spec), capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        message = lines[-1] if lines else f"ganc spec exited with {done.returncode}"
        for prefix in ("ganc: error: spec: ", "ganc: error: "):
            message = message[len(prefix):] if message.startswith(prefix) else message
        raise SpecError(f"spec: {message}")


def _positive_ints(shape) -> bool:
    return isinstance(shape, list) and all(_is_integer(n) and n > 0 for n in shape)


def _validate_scaler(name, scaler) -> None:
    where = f"spec: loss scaler {name!r}"
    _require(name and not any(c in name for c in "\" \t\n"),
             f"{where}: a name cannot be empty or hold quotes or spaces")
    _require(isinstance(scaler, dict), f"{where} must be an object")
    _known_keys(scaler, "scaler", f"{where}: ")
    for key in KEYS["scaler"]:
        scaler.setdefault(key, default("scaler", key))


def _validate_clip(clip, where) -> None:
    _known_keys(clip, "clip", f"{where}: clip_grad_norm: ")
    _require(isinstance(clip, dict) and "max_norm" in clip,
             f"{where}: 'clip_grad_norm' needs a positive 'max_norm'")
    clip.setdefault("norm_type", default("clip", "norm_type"))


def _resolve(module, path):
    obj = module
    for part in path.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


def _validate_stages(stages, module=None) -> None:
    _require(isinstance(stages, dict) and isinstance(stages.get("attributes"), list)
             and stages["attributes"],
             "spec: 'stages' needs 'attributes': the int module attributes that select the stage")
    _require(isinstance(stages.get("list"), list) and stages["list"],
             "spec: 'stages.list' must be a non-empty list of stages")
    _known_keys(stages, "stages", "spec: 'stages': ")
    names = set()
    for i, stage in enumerate(stages["list"]):
        last = i == len(stages["list"]) - 1
        _require(isinstance(stage.get("name"), str) and stage["name"], "spec: every stage needs a 'name'")
        where = f"spec: stage {stage['name']!r}"
        _known_keys(stage, "stage", f"{where}: ")
        _require(stage["name"] not in names, f"{where}: name used twice")
        _require(not any(c in stage["name"] for c in "@\" \t\n"),
                 f"{where}: a stage name cannot hold '@', quotes or spaces")
        names.add(stage["name"])
        _require(last or "steps" in stage,
                 f"{where} needs 'steps' (only the last stage may omit it; it runs to the end)")
        stage.setdefault("fade_steps", default("stage", "fade_steps"))
        stage.setdefault("grows", [])
        if module is not None:
            for block in stage["grows"]:
                _require(isinstance(_resolve(module, block), torch_module()),
                         f"{where} grows {block!r}, which is not a submodule of the model")
    if module is not None:
        for path in stages["attributes"]:
            value = _resolve(module, path)
            _require(_is_integer(value),
                     f"spec: stages: attribute {path!r} is not an int attribute of the model")


def stage_at(stages: dict, step: int):
    """(stage index, first step of that stage) for a training step; the last stage runs on."""
    begin = 0
    for i, stage in enumerate(stages["list"][:-1]):
        if step < begin + stage["steps"]:
            return i, begin
        begin += stage["steps"]
    return len(stages["list"]) - 1, begin


def fade_at(stages: dict, step: int) -> float:
    """The fade-in weight at a training step: min(1, t / fade_steps) at the stage's step t."""
    index, begin = stage_at(stages, step)
    fade_steps = stages["list"][index].get("fade_steps", 0)
    return 1.0 if fade_steps == 0 else min(1.0, (step - begin) / fade_steps)


def torch_module():
    import torch
    return torch.nn.Module


def dumps(spec: dict) -> str:
    return json.dumps(spec, indent=2, sort_keys=True)
