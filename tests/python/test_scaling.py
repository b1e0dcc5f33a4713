"""`ganc train --profile` and `ganc simulate`: the profile describes the plan's phases and
buckets; the simulator's numbers are the documented model's, recomputed here from the profile;
bad input is one line and exit 2."""
import json
import math
import subprocess

import pytest

from conftest import archive, compile_plan


@pytest.fixture(scope="module")
def profiled(ganc_bin, datasets, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile")
    plan = compile_plan(ganc_bin, "dcgan32", str(tmp))
    profile = str(tmp / "profile.json")
    subprocess.run([ganc_bin, "run", "--nproc", "1", plan, "--model", archive("dcgan32"),
                    "--data", datasets["digits"], "--steps", "6", "--out", str(tmp / "run"),
                    "--sample-every", "0", "--checkpoint-every", "0", "--tensorboard", "off",
                    "--threads", "1", "--profile", profile], check=True, capture_output=True)
    return plan, profile


def all_reduce(nbytes, ranks, alpha, beta):
    """The model as documented: the faster of a ring and a double binary tree."""
    if ranks == 1:
        return 0.0
    ring = 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * nbytes / beta
    tree = 2 * math.ceil(math.log2(ranks)) * alpha + 2 * nbytes / beta
    return min(ring, tree)


def test_profile_describes_the_plans_phases(ganc_bin, profiled):
    plan, profile = profiled
    facts = json.loads(subprocess.run([ganc_bin, "explain", plan, "--json"], capture_output=True,
                                      text=True, check=True).stdout)
    p = json.load(open(profile))
    assert p["format"] == "ganc-profile" and p["identity"] == facts["identity"]
    assert p["world_size"] == 1 and p["threads"] == 1 and p["steps"] == 6
    planned = {ph["name"]: ph for ph in facts["phases"]}
    assert {ph["key"] for ph in p["phases"]} == set(planned)
    for ph in p["phases"]:
        assert ph["runs"] == 6
        assert [b["bytes"] for b in ph["buckets"]] == [b["bytes"] for b in planned[ph["key"]]["buckets"]]
        # A bucket is complete during backward, never after it returns.
        for b in ph["buckets"]:
            assert 0 < b["ready_seconds"] <= ph["forward_backward_seconds"]
        assert ph["optimizer_seconds"] > 0


def test_simulation_is_the_documented_model(ganc_bin, profiled):
    plan, profile = profiled
    alpha, beta, cores = 40e-6, 3e9, 2
    out = json.loads(subprocess.run(
        [ganc_bin, "simulate", plan, "--profile", profile, "--gpus", "1,2,4,16", "--ranks-per-host", "4",
         "--cores-per-host", str(cores), "--alpha-us", "40", "--bandwidth-gbps", "3", "--json"],
        capture_output=True, text=True, check=True).stdout)
    p = json.load(open(profile))
    facts = json.loads(subprocess.run([ganc_bin, "explain", plan, "--json"], capture_output=True,
                                      text=True, check=True).stdout)
    order = {ph["name"]: [s["bucket"] for s in ph["schedule"]] for ph in facts["phases"]}

    def expected(ranks):
        slow = max(1.0, min(ranks, 4) * p["threads"] / cores)
        step = flat = 0.0
        for ph in p["phases"]:
            compute, end = ph["forward_backward_seconds"] * slow, 0.0
            for b in order[ph["key"]]:
                bucket = ph["buckets"][b]
                end = max(bucket["ready_seconds"] * slow, end) + all_reduce(bucket["bytes"], ranks, alpha, beta)
            total = sum(b["bytes"] for b in ph["buckets"])
            weight = ph["runs"] / p["steps"]
            step += weight * (compute + max(0.0, end - compute) + ph["optimizer_seconds"] * slow)
            flat += weight * (compute + all_reduce(total, ranks, alpha, beta) + ph["optimizer_seconds"] * slow)
        return step, flat

    assert [row["ranks"] for row in out] == [1, 2, 4, 16]
    base = expected(1)
    for row in out:
        step, flat = expected(row["ranks"])
        assert row["step_seconds"] == pytest.approx(step, rel=1e-9)
        assert row["flat_step_seconds"] == pytest.approx(flat, rel=1e-9)
        assert row["efficiency"] == pytest.approx(base[0] / step, rel=1e-9)
    assert out[0]["efficiency"] == 1.0 and out[0]["exposed_seconds"] == 0.0
    # 4 one-thread ranks on 2 cores: twice the compute.
    assert out[2]["step_seconds"] > 1.9 * out[0]["step_seconds"]
    text = subprocess.run([ganc_bin, "simulate", plan, "--profile", profile, "--gpus", "1,8,64"],
                          capture_output=True, text=True, check=True).stdout
    assert "flat all-reduce" in text and len(text.strip().splitlines()) == 5


@pytest.mark.parametrize("case,mentions", [
    ("other-plan", "profile of another plan"),
    ("empty-gpus", "--gpus is empty"),
    ("zero-gpus", "--gpus takes world sizes"),
    ("not-a-profile", "not JSON"),
    ("unknown-link", "--link takes nvlink, ib, ethernet or loopback"),
])
def test_bad_simulate_input_is_one_line(ganc_bin, profiled, tmp_path, case, mentions):
    plan, profile = profiled
    args = [plan, "--profile", profile, "--gpus", "1,8"]
    if case == "other-plan":
        args[0] = compile_plan(ganc_bin, "mlp", str(tmp_path))
    elif case == "empty-gpus":
        args[4] = ""
    elif case == "zero-gpus":
        args[4] = "0,8"
    elif case == "not-a-profile":
        args[2] = plan
    else:
        args += ["--link", "carrier-pigeon"]
    result = subprocess.run([ganc_bin, "simulate", *args], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and mentions in lines[0], result.stderr
