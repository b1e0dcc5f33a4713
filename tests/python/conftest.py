"""Shared fixtures: the build, the zoo archives and the datasets the parity tests train on."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "models"))

BUILD = os.environ.get("GANC_BUILD_DIR", os.path.join(ROOT, "build"))
GANC = os.path.join(BUILD, "tools", "ganc")
MODELS = os.environ.get("GANC_TEST_MODELS_DIR", os.path.join(BUILD, "tests", "models"))


@pytest.fixture(scope="session")
def ganc_bin():
    if not os.path.exists(GANC):
        pytest.fail(f"{GANC} is not built (run scripts/setup.sh)")
    return GANC


@pytest.fixture(scope="session")
def datasets(tmp_path_factory):
    """Training sets made by the same script users run (nothing downloaded)."""
    out = tmp_path_factory.mktemp("data")
    paths = {}
    for name in ("ring", "digits", "two_domains"):
        path = str(out / f"{name}.pt")
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), name, "-o", path],
                       check=True, stdout=subprocess.DEVNULL)
        paths[name] = path
    return paths


def archive(name):
    path = os.path.join(MODELS, name + ".pt")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: the export_test_models ctest fixture writes it")
    return path


def gradient_dumps(spec, steps, got_dir, ref_dir, ref_loader=None):
    """(step, phase name, ganc's all-reduced gradients, the reference's) for every phase run of
    `steps` steps, read from the --dump-grads files, after checking that both sides gave
    gradients to the same parameters."""
    import torch
    import ganc
    ref_loader = ref_loader or torch.load
    for step in range(steps):
        for phase in spec["phases"]:
            if step % phase.get("interval", 1):
                continue
            name = f"grads_step{step}_{phase['name']}.pt"
            got = ganc.load_checkpoint(os.path.join(got_dir, name))
            ref = ref_loader(os.path.join(ref_dir, name))
            assert set(got) == set(ref), f"{name}: the parameters with a gradient differ"
            yield step, phase["name"], got, ref
