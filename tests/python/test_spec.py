"""The Python spec validator (ganc.validate) rejects every spec of tests/specs/invalid.json, the
list the C++ validator (frontend::parseSpec, tests/unit/SpecTest.cpp) is checked against too,
with a message that names what is wrong."""
import copy
import json
import os
import subprocess

import pytest

import ganc
from ganc.spec import SpecError

HERE = os.path.dirname(os.path.abspath(__file__))
LIST = json.load(open(os.path.join(HERE, "..", "specs", "invalid.json")))


def patched(case):
    spec = copy.deepcopy(LIST["base"])
    spec.update(case.get("set", {}))
    if "phase" in case:
        spec["phases"][0].update(case["phase"])
    if "input" in case:
        spec["phases"][0]["inputs"][0].update(case["input"])
    return spec


def test_base_spec_is_valid():
    ganc.validate(LIST["base"])


@pytest.mark.parametrize("case", LIST["cases"], ids=[c["name"] for c in LIST["cases"]])
def test_python_validator_rejects(case):
    with pytest.raises(SpecError) as error:
        ganc.validate(patched(case))
    assert case["mentions"] in str(error.value)


# ---- every value rule of the schema, checked alike by the Python package and the C++ reader ----

RULES = ganc.spec.RULES
# The schedule type that takes each lr_schedule argument.
SCHEDULE_OF = {"factor": "constant", "start_factor": "linear", "end_factor": "linear", "total_iters": "linear",
               "step_size": "step", "gamma": "exponential", "t_max": "cosine", "eta_min": "cosine"}


def with_value(kind: str, key: str, value) -> dict:
    """A version 2 spec, valid but for `value` at `kind`'s `key` (and the rules that involve
    other fields, which both validators check too)."""
    spec = copy.deepcopy(LIST["base"])
    spec["ganc_spec"] = 2
    d, inputs = spec["phases"][0], spec["phases"][0]["inputs"]
    optimizer = spec["optimizers"]["discriminator"]
    if kind == "spec":
        spec[key] = value
    elif kind == "data":
        spec["data"] = {"shape": [3, 4, 4], key: value}
    elif kind == "phase":
        spec["loss_scalers"] = {"amp": {}}
        spec["phases"][1]["loss_scaler"] = "amp"
        d[key] = value
    elif kind == "input":
        inputs[1][key] = value
    elif kind == "optimizer":
        optimizer["type"] = {"nesterov": "sgd", "dampening": "sgd", "alpha": "rmsprop",
                             "centered": "rmsprop"}.get(key, "adam")
        optimizer[key] = value
    elif kind == "clip":
        optimizer["clip_grad_norm"] = {"max_norm": 1.0, key: value}
    elif kind == "schedule":
        optimizer["lr_schedule"] = {"type": SCHEDULE_OF.get(key, "constant"), key: value}
        if key == "eta_min":
            optimizer["lr_schedule"]["t_max"] = 10
    elif kind == "scaler":
        spec["loss_scalers"] = {"amp": {key: value}}
        d["loss_scaler"] = "amp"
    elif kind == "ema":
        spec["ema"] = {"submodule": "generator", "copy": "generator_ema", "half_life_images": 10.0, key: value}
    elif kind == "sample":
        spec["sample"] = {"submodule": "generator", "noise_shape": [8], key: value}
    elif kind == "stage":
        spec["stages"] = {"attributes": ["generator.stage"], "list": [{"name": "a", "steps": 2, key: value},
                                                                      {"name": "b"}]}
    elif kind == "controller":
        spec["controllers"] = {"p": {"phase": "g", "statistic": "signs_real", key: value}}
    else:
        raise AssertionError(f"no place for {kind}.{key}")
    return spec


def probes(rule: dict) -> list:
    """Values on each side of the rule's edges, and of other JSON types."""
    kind = rule["kind"]
    if kind == "boolean":
        return [True, False, 1, "true", None]
    if kind == "text":
        return ["a", "", 3, None]
    if kind == "choice":
        return list(rule["names"]) + ["nope", 1, None]
    values = ["x", True, None]
    for edge in (rule.get("low"), rule.get("high")):
        if edge is not None:
            step = 1 if kind == "integer" else 1e-3
            values += [edge, edge - step, edge + step]
    values += [7, 0.5] if kind == "number" else [7, 1.5]
    values += list(rule.get("names", []))
    if rule.get("count"):
        values = [[v] * rule["count"] for v in values if not isinstance(v, list)] + [[0.5]]
    return values


def test_each_value_rule_is_checked_alike_by_python_and_the_compiler(ganc_bin, monkeypatch):
    """Every rule of frontend/SpecFields.def's VALUE column, probed on both sides of its edges:
    a value outside its rule is refused by the Python package's own checks (without the
    compiler's) and by `ganc spec`, both in the rule's words, and a value within it by neither
    for that rule."""
    monkeypatch.setattr(ganc.spec, "check_with_compiler", lambda spec: None)
    cases = [(kind, key, rule, value) for kind, rules in RULES.items() for key, rule in rules.items()
             for value in probes(rule)]
    assert len({(kind, key) for kind, key, _, _ in cases}) >= 60, "the schema's rules are not all probed"
    specs = [with_value(kind, key, value) for kind, key, _, value in cases]
    compiled = subprocess.run([ganc_bin, "spec", "--each", "-"], input=json.dumps(specs),
                              capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(compiled) == len(cases)
    refused_by_rule, disagree = 0, []
    for (kind, key, rule, value), spec, cxx in zip(cases, specs, compiled):
        try:
            ganc.validate(spec)
            python = "ok"
        except SpecError as error:
            python = str(error)
        words = f"'{key}' must be {rule['text']}, got {json.dumps(value, separators=(',', ':'))}"
        if (words in python) != (words in cxx):
            disagree.append(f"{kind}.{key} = {json.dumps(value)}: Python says {python!r}, ganc spec {cxx!r}")
        refused_by_rule += words in cxx
    assert not disagree, "\n".join(disagree)
    assert refused_by_rule >= 150
