"""The Python spec validator (ganc.validate) rejects every spec of tests/specs/invalid.json, the
list the C++ validator (frontend::parseSpec, tests/unit/SpecTest.cpp) is checked against too,
with a message that names what is wrong."""
import copy
import json
import os

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
