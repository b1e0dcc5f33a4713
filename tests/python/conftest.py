"""Shared fixtures: the build, the zoo archives and the datasets the parity tests train on."""
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "models"))

BUILD = os.environ.get("GANC_BUILD_DIR", os.path.join(ROOT, "build"))
GANC = os.path.join(BUILD, "tools", "ganc")
MODELS = os.environ.get("GANC_TEST_MODELS_DIR", os.path.join(BUILD, "tests", "models"))


def pytest_configure(config):
    # pytest-xdist registers it where it is installed (the GPU tests' runs use it to share work).
    config.addinivalue_line("markers", "xdist_group(name): run on one worker under --dist loadgroup")


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


@pytest.fixture(scope="module")
def digits16(tmp_path_factory):
    """scikit-learn's digits at 16x16 RGB, made by the script users run."""
    path = str(tmp_path_factory.mktemp("data") / "digits16.pt")
    subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), "digits", "--size", "16", "-o", path],
                   check=True, stdout=subprocess.DEVNULL)
    return path


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
            if step % phase.get("interval", 1) or not phase.get("updates"):  # sections train nothing
                continue
            name = f"grads_step{step}_{phase['name']}.pt"
            got = ganc.load_checkpoint(os.path.join(got_dir, name))
            ref = ref_loader(os.path.join(ref_dir, name))
            assert set(got) == set(ref), f"{name}: the parameters with a gradient differ"
            yield step, phase["name"], got, ref


# timing.json's fields, the same on CPU and on CUDA.
TIMING_FIELDS = {"device", "step_seconds", "work_seconds", "overhead_seconds", "run_host_seconds",
                 "replay_host_seconds", "replay_launch_seconds", "graph_nodes", "graph_branches",
                 "graph_memsets_as_kernels", "graph_copies_as_kernels", "phases", "kernel_time",
                 "skipped_steps", "wall_seconds"}


def compile_plan(ganc_bin, model, out):
    plan = os.path.join(out, model + ".plan")
    subprocess.run([ganc_bin, "compile", archive(model), "-o", plan], check=True)
    return plan


def train_args(plan, model, data, out, steps, *extra):
    return [plan, "--model", archive(model), "--data", data, "--steps", str(steps), "--out", out,
            "--sample-every", "0", "--log-every", "1000", *extra]


def started_ranks(launcher, n):
    """The pids of the `n` ranks `ganc run` started, once they have been training a while."""
    children = []
    deadline = time.time() + 60
    while len(children) < n and time.time() < deadline:
        out = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout
        children = [int(p) for p in out.split()]
        time.sleep(0.2)
    assert len(children) == n, "the ranks did not start"
    time.sleep(3)  # let training get going
    return children


def tensors_of(obj, path=""):
    """(path, tensor) for every tensor in a nested dict/list (a checkpoint: weights, buffers,
    optimizer and loss-scaler state, the ranks' generator states)."""
    import torch
    if torch.is_tensor(obj):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors_of(v, f"{path}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors_of(v, f"{path}/{i}")


def assert_equal(a, b, where):
    """`a` and `b` equal all the way down (tensors bit for bit); `where` names the place that differs."""
    import torch
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            assert_equal(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where
