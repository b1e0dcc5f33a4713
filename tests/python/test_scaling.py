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
        assert ph["runs"] == ph["timed_runs"] == 6
        assert [b["bytes"] for b in ph["buckets"]] == [b["bytes"] for b in planned[ph["key"]]["buckets"]]
        # A bucket is complete during backward, never after it returns; a gradient is ready no
        # later than its bucket.
        for b in ph["buckets"]:
            assert 0 < b["ready_seconds"] <= ph["forward_backward_seconds"]
        assert ph["forward_backward_seconds"] <= ph["all_reduced_seconds"]
        bucket_of = {s["parameter"]: i for i, b in enumerate(planned[ph["key"]]["buckets"]) for s in b["slots"]}
        assert [q["name"] for q in ph["parameters"]] == planned[ph["key"]]["used"]
        for q in ph["parameters"]:
            assert 0 < q["ready_seconds"] <= ph["buckets"][bucket_of[q["name"]]]["ready_seconds"]
        assert ph["optimizer_seconds"] > 0


def half_ring(nbytes, ranks, alpha, beta):
    """A reduce-scatter or all-gather, as documented: (N-1) alpha + (N-1)/N B / beta."""
    return 0.0 if ranks == 1 else (ranks - 1) * alpha + (ranks - 1) / ranks * nbytes / beta


def documented_model(facts, p, ranks, alpha, beta, slow=1.0):
    """(step, flat step) by the simulator's model: each of the plan's buckets ready when its last
    gradient was profiled, reduced in the plan's order one at a time; sharded plans
    reduce-scatter (stage 2), step 1/ranks of the optimizer bucket by bucket and all-gather
    each bucket once stepped."""
    zero = facts["zero"] if ranks > 1 else 0
    planned = {ph["name"]: ph for ph in facts["phases"]}
    step = flat = 0.0
    for ph in p["phases"]:
        ready = {q["name"]: q["ready_seconds"] for q in ph["parameters"]}
        plan_phase = planned[ph["key"]]
        buckets = [plan_phase["buckets"][s["bucket"]] for s in plan_phase["schedule"]]
        compute, optimizer = ph["forward_backward_seconds"] * slow, ph["optimizer_seconds"] * slow
        end = 0.0
        for b in buckets:
            at = max(ready[s["parameter"]] for s in b["slots"]) * slow
            collective = half_ring if zero == 2 else all_reduce
            end = max(at, end) + collective(b["bytes"], ranks, alpha, beta)
        total = sum(b["bytes"] for b in buckets)
        done = max(compute, end) + optimizer
        if zero:
            stepped, gathered = max(compute, end), 0.0
            for b in buckets:
                stepped += optimizer / ranks * b["bytes"] / total
                gathered = max(stepped, gathered) + half_ring(b["bytes"], ranks, alpha, beta)
            done = max(stepped, gathered)
        weight = ph["runs"] / p["steps"]
        step += weight * done
        flat += weight * (compute + all_reduce(total, ranks, alpha, beta) + optimizer)
    return step, flat


def explain(ganc_bin, plan):
    return json.loads(subprocess.run([ganc_bin, "explain", plan, "--json"], capture_output=True, text=True,
                                     check=True).stdout)


def test_simulation_is_the_documented_model(ganc_bin, profiled):
    plan, profile = profiled
    alpha, beta, cores = 40e-6, 3e9, 2
    out = json.loads(subprocess.run(
        [ganc_bin, "simulate", plan, "--profile", profile, "--gpus", "1,2,4,16", "--ranks-per-host", "4",
         "--cores-per-host", str(cores), "--alpha-us", "40", "--bandwidth-gbps", "3", "--json"],
        capture_output=True, text=True, check=True).stdout)
    p = json.load(open(profile))
    facts = explain(ganc_bin, plan)

    def expected(ranks):
        return documented_model(facts, p, ranks, alpha, beta, max(1.0, min(ranks, 4) * p["threads"] / cores))

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


def test_a_phase_without_timings_is_left_out_and_said(ganc_bin, profiled, tmp_path):
    """A plan phase the profiled run never timed (a lazy regulariser of a short run, a stage it
    did not reach) cannot be predicted: the prediction is the profiled phases' alone, and a
    warning names the phase (a GancWarning in Python)."""
    plan, profile = profiled
    p = json.load(open(profile))
    p["phases"] = [ph for ph in p["phases"] if ph["key"] == "d"]
    partial = str(tmp_path / "partial.json")
    json.dump(p, open(partial, "w"))
    result = subprocess.run([ganc_bin, "simulate", plan, "--profile", partial, "--gpus", "1,8",
                             "--link", "ethernet", "--json"], capture_output=True, text=True, check=True)
    assert result.stderr.strip().splitlines() == [
        f"ganc: warning: simulate: {partial} has no timings for phase 'g' (no run after the warm-up; "
        "profile more steps): the predictions leave it out"]
    out = json.loads(result.stdout)
    for row in out:
        alpha, beta = (5e-6, 300e9) if row["ranks"] <= 8 else (30e-6, 10e9)
        assert row["step_seconds"] == pytest.approx(
            documented_model(explain(ganc_bin, plan), p, row["ranks"], alpha, beta)[0], rel=1e-9)
    # From Python, which does not echo the command's output, the warning is a GancWarning.
    import ganc
    with pytest.warns(ganc.GancWarning, match="has no timings for phase 'g'"):
        assert ganc.simulate(plan, partial, gpus=[1, 8], link="ethernet") == out
    # Autotuning: the phase keeps the command line's caps, and the warning says which.
    tuned = str(tmp_path / "tuned.plan")
    result = subprocess.run([ganc_bin, "compile", archive("dcgan32"), "-o", tuned, "--bucket-cap-mb", "auto",
                             "--target-gpus", "64", "--profile", partial, "--first-bucket-mb", "0.5"],
                            capture_output=True, text=True, check=True)
    assert result.stderr.splitlines()[0] == (
        f"ganc: warning: compile: {partial} has no timings for phase 'g' (no run after the warm-up; "
        "profile more steps): not autotuned, its buckets are capped at 25 MiB (the first at 0.5 MiB)")
    phases = {ph["name"]: ph for ph in explain(ganc_bin, tuned)["phases"]}
    assert phases["d"]["tuned_ranks"] == 64 and phases["g"]["tuned_ranks"] == 0
    plain = str(tmp_path / "plain.plan")
    subprocess.run([ganc_bin, "compile", archive("dcgan32"), "-o", plain, "--first-bucket-mb", "0.5"],
                   capture_output=True, check=True)
    untuned = {ph["name"]: ph for ph in explain(ganc_bin, plain)["phases"]}["g"]
    assert phases["g"]["buckets"] == untuned["buckets"] and len(untuned["buckets"]) > 1


@pytest.mark.parametrize("zero", [1, 2])
def test_simulation_of_other_caps_and_sharded_plans(ganc_bin, profiled, tmp_path, zero):
    """One profile predicts any plan of its model: here one with 256 KiB buckets, sharded
    (ZeRO stage 1 or 2); the numbers are the documented model's for that plan's buckets."""
    _, profile = profiled
    plan = str(tmp_path / "sharded.plan")
    subprocess.run([ganc_bin, "compile", archive("dcgan32"), "-o", plan, "--bucket-cap-mb", "0.25",
                    "--first-bucket-mb", "0.25", "--zero", str(zero), "--ranks", "8"], check=True, capture_output=True)
    facts = explain(ganc_bin, plan)
    assert facts["zero"] == zero and max(len(ph["buckets"]) for ph in facts["phases"]) > 2
    out = json.loads(subprocess.run(
        [ganc_bin, "simulate", plan, "--profile", profile, "--gpus", "1,8,64", "--link", "ethernet", "--json"],
        capture_output=True, text=True, check=True).stdout)
    p = json.load(open(profile))
    for row in out:
        # Within a host (8 ranks) NVLink, beyond it Ethernet; one rank runs unsharded.
        alpha, beta = (5e-6, 300e9) if row["ranks"] <= 8 else (30e-6, 10e9)
        step, flat = documented_model(facts, p, row["ranks"], alpha, beta)
        assert row["step_seconds"] == pytest.approx(step, rel=1e-9)
        assert row["flat_step_seconds"] == pytest.approx(flat, rel=1e-9)


@pytest.mark.parametrize("case,mentions", [
    ("other-plan", "profile of another model"),
    ("empty-gpus", "--gpus is empty"),
    ("zero-gpus", "--gpus takes world sizes"),
    ("not-a-profile", "not valid JSON"),
    ("unknown-link", "--link takes nvlink, ib, ethernet or loopback"),
    ("cores-for-gpu", "--cores-per-host models CPU ranks sharing cores"),
    # A profile edited or damaged by hand: each names the file, the phase and the parameter.
    ("newer-version", "is a ganc profile of version 2; this ganc reads version 1"),
    ("phase-twice", "profiles phase 'd' twice"),
    ("negative-time", "phase 'g': optimizer_seconds is -0.001; it must be a time in seconds (not negative)"),
    ("no-runs", "phase 'g': runs is 0; it must be at least 1"),
    ("foreign-parameter", "phase 'd' times parameter 'generator.main.0.weight', which this plan's "
                          "phase does not train"),
    ("missing-parameter", "phase 'g' has no ready time for parameter 'generator.main.0.weight'"),
    ("parameter-twice", "times parameter 'discriminator.main.0.weight' twice"),
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
    elif case == "cores-for-gpu":
        gpu = json.load(open(profile)) | {"device": "cuda"}
        args[2] = str(tmp_path / "gpu.json")
        json.dump(gpu, open(args[2], "w"))
        args += ["--cores-per-host", "2"]
    elif case == "unknown-link":
        args += ["--link", "carrier-pigeon"]
    else:
        edited = json.load(open(profile))
        phases = {ph["key"]: ph for ph in edited["phases"]}
        if case == "newer-version":
            edited["version"] = 2
        elif case == "phase-twice":
            edited["phases"].append(phases["d"])
        elif case == "negative-time":
            phases["g"]["optimizer_seconds"] = -0.001
        elif case == "no-runs":
            phases["g"]["runs"] = 0
        elif case == "foreign-parameter":
            phases["d"]["parameters"][0]["name"] = "generator.main.0.weight"
        elif case == "missing-parameter":
            phases["g"]["parameters"] = [q for q in phases["g"]["parameters"]
                                         if q["name"] != "generator.main.0.weight"]
        else:
            phases["d"]["parameters"].append(phases["d"]["parameters"][0])
        args[2] = str(tmp_path / "edited.json")
        json.dump(edited, open(args[2], "w"))
    result = subprocess.run([ganc_bin, "simulate", *args], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and mentions in lines[0], result.stderr


def test_autotune_picks_the_caps_the_model_prefers(ganc_bin, profiled, tmp_path):
    """A backward of 1 s whose gradients arrive evenly in ready order (the last as it ends),
    over a 10 MB/s link at 64 ranks: small buckets overlap it. D (655 KiB, one bucket under
    DDP's caps, 134 ms exposed) must get smaller ones that leave less exposed. The exposed
    time the plan reports must be the model's for the buckets it holds. Over 100 Gb/s
    Ethernet the same profile leaves DDP's caps well under 2 % of the phase to save: both
    phases keep them."""
    plan, profile = profiled
    facts = json.loads(subprocess.run([ganc_bin, "explain", plan, "--json"], capture_output=True,
                                      text=True, check=True).stdout)
    order = {ph["name"]: ph["ready_order"] for ph in facts["phases"]}
    p = json.load(open(profile))
    ready = {}
    for ph in p["phases"]:
        ph["forward_backward_seconds"] = 1.0
        names = order[ph["key"]]
        ready[ph["key"]] = {name: (k + 1) / len(names) for k, name in enumerate(names)}
        ph["parameters"] = [{"name": n, "ready_seconds": t} for n, t in ready[ph["key"]].items()]
    synthetic = str(tmp_path / "profile.json")
    json.dump(p, open(synthetic, "w"))
    tuned = str(tmp_path / "tuned.plan")
    subprocess.run([ganc_bin, "compile", archive("dcgan32"), "-o", tuned, "--bucket-cap-mb", "auto",
                    "--target-gpus", "64", "--profile", synthetic, "--alpha-us", "30", "--bandwidth-gbps", "0.01"],
                   check=True, capture_output=True)
    report = subprocess.run([ganc_bin, "explain", tuned], capture_output=True, text=True, check=True).stdout
    assert "buckets autotuned for 64 ranks" in report
    alpha, beta = 30e-6, 10e6
    optimizer = {q["key"]: q["optimizer_seconds"] for q in p["phases"]}
    for ph in json.loads(subprocess.run([ganc_bin, "explain", tuned, "--json"], capture_output=True,
                                        text=True, check=True).stdout)["phases"]:
        assert ph["tuned_ranks"] == 64
        end = 0.0
        buckets = sorted(((max(ready[ph["name"]][s["parameter"]] for s in b["slots"]), b["bytes"])
                          for b in ph["buckets"]))
        for at, nbytes in buckets:
            end = max(at, end) + all_reduce(nbytes, 64, alpha, beta)
        assert ph["tuned_exposed_seconds"] == pytest.approx(max(0.0, end - 1.0), rel=1e-9, abs=1e-12)
        # Other caps than DDP's only where the phase is predicted at least 2 % faster.
        assert (ph["first_bucket_cap_bytes"], ph["bucket_cap_bytes"]) == (1 << 20, 25 << 20) \
            or ph["default_exposed_seconds"] - ph["tuned_exposed_seconds"] \
            >= 0.02 * (1.0 + ph["default_exposed_seconds"] + optimizer[ph["name"]])
        if ph["name"] == "d":
            assert ph["tuned_exposed_seconds"] < 0.8 * ph["default_exposed_seconds"]
            assert ph["bucket_cap_bytes"] < 1 << 20 and len(ph["buckets"]) > 1
        assert ph["tuned_exposed_seconds"] <= ph["default_exposed_seconds"]
    # A named link and the same link given by its numbers (as a measured one is): one plan.
    plans = []
    for links in (["--link", "ethernet"], ["--ranks-per-host", "8", "--alpha-us", "30", "--bandwidth-gbps", "10"]):
        plans.append(str(tmp_path / f"links{len(plans)}.plan"))
        subprocess.run([ganc_bin, "compile", archive("dcgan32"), "-o", plans[-1], "--bucket-cap-mb", "auto",
                        "--target-gpus", "64", "--profile", synthetic, *links], check=True, capture_output=True)
    assert open(plans[0]).read() == open(plans[1]).read()
    for ph in json.loads(subprocess.run([ganc_bin, "explain", plans[0], "--json"], capture_output=True,
                                        text=True, check=True).stdout)["phases"]:
        assert (ph["first_bucket_cap_bytes"], ph["bucket_cap_bytes"]) == (1 << 20, 25 << 20)
        assert ph["tuned_exposed_seconds"] == ph["default_exposed_seconds"] < 0.02


def test_autotune_needs_its_inputs(ganc_bin, profiled, tmp_path):
    plan, profile = profiled
    for args, mentions in ((["--bucket-cap-mb", "auto", "--target-gpus", "8"], "needs --target-gpus N and --profile"),
                           (["--target-gpus", "8", "--profile", profile], "add --bucket-cap-mb auto"),
                           (["--alpha-us", "20"], "add --bucket-cap-mb auto"),
                           (["--bucket-cap-mb", "auto", "--target-gpus", "8", "--profile", profile,
                             "--bandwidth-gbps", "0"], "--bandwidth-gbps takes a positive number"),
                           (["--bucket-cap-mb", "auto", "--target-gpus", "8", "--profile", profile,
                             "--link", "pigeon"], "--link takes nvlink, ib, ethernet or loopback")):
        result = subprocess.run([ganc_bin, "compile", archive("dcgan32"), "-o", str(tmp_path / "p.plan"), *args],
                                capture_output=True, text=True)
        assert result.returncode == 2 and mentions in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    result = subprocess.run([ganc_bin, "compile", archive("mlp"), "-o", str(tmp_path / "p.plan"),
                             "--bucket-cap-mb", "auto", "--target-gpus", "8", "--profile", profile],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "profile of another model" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_python_api_simulates_and_autotunes(ganc_bin, profiled, tmp_path):
    """ganc.simulate and ganc.compile(bucket_cap_mb="auto") from Python: the command's numbers
    and plan; bad input raises GancError with the command's line and exit code."""
    import ganc
    plan, profile = profiled
    rows = ganc.simulate(plan, profile, gpus=[1, 8, 64], link="ethernet")
    cli = json.loads(subprocess.run([ganc_bin, "simulate", plan, "--profile", profile, "--gpus", "1,8,64",
                                     "--link", "ethernet", "--json"], capture_output=True, text=True,
                                    check=True).stdout)
    assert rows == cli
    tuned = ganc.compile(archive("dcgan32"), str(tmp_path / "tuned.plan"), bucket_cap_mb="auto", target_gpus=64,
                         profile=profile, link="ethernet")
    assert all(tuned.phase(name)["tuned_ranks"] == 64 for name in tuned.phases)
    with pytest.raises(ganc.GancError) as error:
        ganc.simulate(plan, profile, gpus=[])
    assert error.value.exit_code == 2 and "--gpus is empty" in str(error.value)
    assert ganc.simulate(plan, profile, gpus=64, link="ethernet") == cli[2:]  # one world size
    with pytest.raises(TypeError, match="gpus= takes world sizes"):
        ganc.simulate(plan, profile, gpus="64")  # would be 6 and 4


def test_unwritable_profile_path_is_refused_at_start(ganc_bin, datasets, tmp_path):
    """--profile is written when training ends: a path that cannot take it fails at once, one
    line, exit 2, before any step (nothing trained is lost)."""
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    result = subprocess.run([ganc_bin, "train", plan, "--model", archive("mlp"), "--data", datasets["ring"],
                             "--steps", "3", "--out", str(tmp_path / "run"), "--tensorboard", "off",
                             "--profile", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "is a directory" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "step" not in result.stdout


def test_multi_rank_profile_is_checked_against_the_model(ganc_bin, datasets, tmp_path):
    """A profile of 2 ranks measured its exposed communication: `ganc simulate` prints it beside
    the model's prediction for 2 ranks on the given links."""
    import re
    plan = compile_plan(ganc_bin, "mlp", str(tmp_path))
    profile = str(tmp_path / "profile.json")
    subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", archive("mlp"), "--data", datasets["ring"],
                    "--steps", "6", "--out", str(tmp_path / "run"), "--sample-every", "0", "--checkpoint-every", "0",
                    "--tensorboard", "off", "--threads", "1", "--profile", profile], check=True, capture_output=True)
    p = json.load(open(profile))
    assert p["world_size"] == 2
    measured = sum(max(0.0, ph["all_reduced_seconds"] - ph["forward_backward_seconds"]) * ph["runs"] / p["steps"]
                   for ph in p["phases"])
    links = ["--link", "loopback", "--ranks-per-host", "1"]
    text = subprocess.run([ganc_bin, "simulate", plan, "--profile", profile, "--gpus", "1,2", *links],
                          capture_output=True, text=True, check=True).stdout
    predicted = json.loads(subprocess.run([ganc_bin, "simulate", plan, "--profile", profile, "--gpus", "2", *links,
                                           "--json"], capture_output=True, text=True, check=True).stdout)[0]
    line = re.search(r"the profiled run \(2 ranks\) left ([\d.]+) ms exposed per step; these links predict "
                     r"([\d.]+) ms", text)
    assert line, text
    assert float(line.group(1)) == pytest.approx(measured * 1e3, abs=1e-3)
    assert float(line.group(2)) == pytest.approx(predicted["exposed_seconds"] * 1e3, abs=1e-3)
