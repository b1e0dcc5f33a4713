"""The ganc spec (ganc.json): what the phases of a GAN are and how to train them.

The schema is versioned by the integer field ``ganc_spec``; docs/spec.md documents it. Its
keys, the version that added each and each value's rule (kind, bounds, names, default) are
declared once, in frontend/SpecFields.def; this package reads them from spec_fields.json
(generated from it, checked for drift by the tests). ``validate`` runs the C++ validator
(``ganc spec -``, the one `ganc compile` runs) for every rule that needs no module, so a spec
ganc.export accepts is one ganc compile accepts; the package checks only what needs the live
module itself.
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


def within(name: str, path: str) -> bool:
    """`name` is `path` or lies inside it ("generator.mapping.0.weight" in "generator")."""
    return name == path or name.startswith(path + ".")


def _normalise_optimizer(opt: dict) -> dict:
    """Fills in one optimizer group's torch.optim defaults (by its type)."""
    opt.setdefault("lr", 2e-4 if opt["type"] in ("adam", "adamw") else 1e-2)
    if opt["type"] in ("adam", "adamw"):
        opt.setdefault("betas", default("optimizer", "betas"))
        opt.setdefault("eps", default("optimizer", "eps"))
        opt.setdefault("weight_decay", 0.0 if opt["type"] == "adam" else 1e-2)
    else:
        opt.setdefault("momentum", default("optimizer", "momentum"))
        opt.setdefault("weight_decay", 0.0)
    if opt["type"] == "rmsprop":
        opt.setdefault("alpha", default("optimizer", "alpha"))
        opt.setdefault("eps", default("optimizer", "eps"))
    if "clip_grad_norm" in opt:
        opt["clip_grad_norm"].setdefault("norm_type", default("clip", "norm_type"))
    return opt


# Each schedule type: its torch.optim.lr_scheduler class and the keyword arguments it takes.
SCHEDULES = {
    "constant": ("ConstantLR", ("factor", "total_iters")),
    "linear": ("LinearLR", ("start_factor", "end_factor", "total_iters")),
    "step": ("StepLR", ("step_size", "gamma")),
    "cosine": ("CosineAnnealingLR", ("t_max", "eta_min")),
    "exponential": ("ExponentialLR", ("gamma",)),
}
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
    return declared if declared is not None else _normalise_optimizer({"type": "adam"})


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
    """Checks `spec` and returns a normalised copy with defaults filled in.

    Every rule that needs no module is the compiler's: `ganc spec` (the validator `ganc compile`
    runs) checks the spec first. Here: every key and value against the schema's rules (the same
    table, so the check stands where ganc's tools are not built yet), and, given the module,
    that the methods, submodules and attributes the spec names exist.
    """
    _require(isinstance(spec, dict), "spec: must be a JSON object")
    spec = copy.deepcopy(spec)
    check_with_compiler(spec)
    _check_schema(spec)
    if spec.get("ganc_spec") != 1:  # a version 1 spec is written back as it was
        spec.setdefault("precision", default("spec", "precision"))
    spec.setdefault("dtype", default("spec", "dtype"))
    spec.setdefault("buffers", default("spec", "buffers"))
    for phase in spec["phases"]:
        phase.setdefault("interval", default("phase", "interval"))
        phase.setdefault("updates", [])
        phase.setdefault("inputs", [])
        if spec.get("ganc_spec") != 1:
            phase.setdefault("accumulate", default("phase", "accumulate"))
            phase.setdefault("precision", spec["precision"])
    for scaler in spec.get("loss_scalers", {}).values():
        for key in KEYS["scaler"]:
            scaler.setdefault(key, default("scaler", key))
    for opt in spec.setdefault("optimizers", {}).values():
        _normalise_optimizer(opt)
    for stage in spec.get("stages", {}).get("list", []):
        stage.setdefault("fade_steps", default("stage", "fade_steps"))
        stage.setdefault("grows", [])
    if module is not None:
        _check_against(spec, module)
    return spec


def _check_schema(spec: dict) -> None:
    """Every object's keys and values against spec_fields.json (frontend/SpecFields.def)."""
    _require(spec.get("ganc_spec") in READ_VERSIONS and _is_integer(spec.get("ganc_spec")),
             f"spec: 'ganc_spec' must be one of {READ_VERSIONS}, got {spec.get('ganc_spec')!r}")
    _known_keys(spec, "spec", "spec: ")
    for key in ("name", "batch_size", "data", "phases"):
        _require(key in spec, f"spec: missing {key!r}")
    _known_keys(spec["data"], "data", "spec: 'data': ")
    for i, phase in enumerate(spec["phases"]):
        where = f"spec: phase {phase.get('name', i)!r}"
        _known_keys(phase, "phase", f"{where}: ")
        for inp in phase.get("inputs", []):
            _known_keys(inp, "input", f"{where}: input {inp.get('name')!r}: ")
    for name, scaler in spec.get("loss_scalers", {}).items():
        _known_keys(scaler, "scaler", f"spec: loss scaler {name!r}: ")
    for group, opt in spec.get("optimizers", {}).items():
        where = f"spec: optimizer of {group!r}"
        _known_keys(opt, "optimizer", f"{where}: ")
        _require("type" in opt, f"{where} needs a 'type'")
        _known_keys(opt.get("clip_grad_norm"), "clip", f"{where}: clip_grad_norm: ")
        _known_keys(opt.get("lr_schedule"), "schedule", f"{where}: lr_schedule: ")
    for key, kind in (("ema", "ema"), ("sample", "sample"), ("stages", "stages")):
        _known_keys(spec.get(key), kind, f"spec: {key!r}: ")
    for stage in spec.get("stages", {}).get("list", []):
        _known_keys(stage, "stage", f"spec: stage {stage.get('name')!r}: ")
    for name, controller in spec.get("controllers", {}).items():
        _known_keys(controller, "controller", f"spec: controller {name!r}: ")


def _check_against(spec: dict, module) -> None:
    """What the spec names exists in the module: methods, submodules, batch norm layers, the
    stages' attributes, and the optimizer groups' parameters."""
    import torch
    submodules = dict(module.named_modules())  # dotted paths too ("generator.main.1"), as compile takes
    for sub in spec.get("sync_batch_norm", []):
        _require(sub in submodules, f"spec: 'sync_batch_norm': {sub!r} is not a submodule")
        _require(any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in submodules[sub].modules()),
                 f"spec: 'sync_batch_norm': {sub!r} has no batch norm layer")
    for phase in spec["phases"]:
        _require(hasattr(module, phase["method"]),
                 f"spec: phase {phase['name']!r}: method {phase['method']!r} does not exist on the module")
    optimizer_groups(spec, [name for name, _ in module.named_parameters()])
    ema = spec.get("ema")
    for name in (ema["submodule"], ema["copy"]) if ema else ():
        _require(isinstance(getattr(module, name, None), torch.nn.Module), f"spec: 'ema': {name!r} is not a submodule")
    sample = spec.get("sample")
    if sample is not None and "method" in sample:
        _require(hasattr(module, sample["method"]), f"spec: sample method {sample['method']!r} does not exist on the module")
    elif sample is not None:
        _require(isinstance(getattr(module, sample["submodule"], None), torch.nn.Module),
                 f"spec: sample submodule {sample['submodule']!r} does not exist")
    stages = spec.get("stages")
    for stage in stages["list"] if stages else ():
        for block in stage["grows"]:
            _require(isinstance(_resolve(module, block), torch.nn.Module),
                     f"spec: stage {stage['name']!r} grows {block!r}, which is not a submodule of the model")
    for path in stages["attributes"] if stages else ():
        _require(_is_integer(_resolve(module, path)),
                 f"spec: stages: attribute {path!r} is not an int attribute of the model")


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


def _resolve(module, path):
    obj = module
    for part in path.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


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


def dumps(spec: dict) -> str:
    return json.dumps(spec, indent=2, sort_keys=True)
