"""What docs/benchmarks.md shows of each result in bench/results: a few rows of (what,
baseline, ganc, ratio), read from the numbers the benchmark wrote (scripts/gen_docs.py renders
them; the JSON keeps every number). Plain Python: no torch needed.

A new benchmark adds its function to SUMMARIES, keyed by the `benchmark` name its results
carry; gen_docs refuses a result that has none."""


def _s(seconds):
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _x(ratio):
    return f"{ratio:.2f}x"


def _g(value):
    return "0" if value == 0 else f"{value:.2g}"


def augment_nvidia(r):
    n = r["numbers"]
    worst = max(v["max_relative_difference"] for v in n.values())
    bgc = n["bgc"]
    return [("every --augpipe at p 0, 0.5, 1, same seed: largest image difference", "NVIDIA's AugmentPipe", _g(worst),
             ""),
            ("bgc, one call (p = 1)", f"NVIDIA's {bgc['nvidia_ms']:.0f} ms", f"{bgc['ganc_ms']:.0f} ms",
             _x(bgc["nvidia_ms"] / bgc["ganc_ms"]))]


def double_backward_probe(r):
    rows = []
    for batch, row in r["by_batch"].items():
        for phase in ("Dreg", "Greg"):
            own = "grouped" if f"{phase}_grouped_seconds" in row else "wgrad"
            native, ganc = row[f"{phase}_native_seconds"], row[f"{phase}_{own}_seconds"]
            rows.append((f"{phase} (batch {batch}), s/step", f"PyTorch double backward {_s(native)}",
                         f"{own} {_s(ganc)}", _x(native / ganc)))
    return rows


def fid_speed(r):
    n = r["numbers"]
    recipe = n["stylegan_recipe"]["seconds"]
    rows = []
    for key, value in n.items():
        if key.startswith("ganc_") and key.endswith("_ranks"):
            ranks = key.split("_")[1]
            rows.append((f"{n['metric']}, {ranks} rank(s), seconds of evaluation", f"StyleGAN's recipe {recipe:.1f} s",
                         f"{value['evaluation_seconds']:.1f} s", _x(recipe / value["evaluation_seconds"])))
    rows.append(("FID, relative difference", "StyleGAN's recipe", _g(n["relative_difference"]), ""))
    return rows


def gpu_dcgan64_baselines(r):
    ms = r["numbers"]["ms_per_step"]
    ganc = ms["ganc (CUDA Graph replay)"]
    return [("ms/step", f"{name} {value:.2f} ms", f"{ganc:.2f} ms", _x(value / ganc))
            for name, value in ms.items() if value and not name.startswith("ganc")]


def joint_executor(r):
    n = r["numbers"]
    rows = []
    for model, m in n.items():
        if isinstance(m, dict):
            script, joint = m["torchscript"], m["joint"]
            rows.append((f"{model}, {n['ranks']} CPU ranks, images/s", f"TorchScript executor "
                         f"{script['images_per_second']:.0f}", f"{joint['images_per_second']:.0f}",
                         _x(m["speed_ratio"])))
            rows.append((f"{model}, peak memory of a rank", f"{script['peak_rss_mib']:.0f} MiB",
                         f"{joint['peak_rss_mib']:.0f} MiB", _x(m["memory_ratio"])))
    return rows


def nvidia_stylegan2_ada(r):
    worst = max(r["max_relative_gradient_difference"].values())
    return [(f"NVIDIA's networks, {r['ranks']} ranks, {r['steps']} steps, largest gradient difference",
             "eager DDP", _g(worst), ""),
            ("final tensors bitwise equal", "eager DDP",
             f"{r['final_tensors_bitwise_equal']} of {r['final_tensors']}", "")]


def nvidia_workflow(r):
    n = r["numbers"]
    return [("their networks (paper256 sizes) and AugmentPipe unchanged: export, 2 CPU ranks, snapshot, their "
             "loader", "NVIDIA's workflow", f"{n['steps']} steps, pickle holds {', '.join(n['snapshot_keys'])}",
             "ok" if n["losses_finite"] and n["generated_finite"] else "failed")]


def nvidia_stylegan3(r):
    rows = []
    for mode, run in r["numbers"]["fusion"].items():
        diffs = run["max_relative_gradient_difference"]
        first = max(d["first_step"] for d in diffs.values())
        fused = sum(run["fused"].get(p, {}).get("upfirdn2d", 0) if isinstance(run["fused"].get(p), dict) else 0
                    for p in run["fused"])
        rows.append((f"--fusion {mode}: largest gradient difference, first step"
                     + (f" ({fused} resamplings fused)" if fused else ""), "eager DDP", _g(first), ""))
        rows.append((f"--fusion {mode}: final parameters", "eager DDP",
                     _g(run["final_parameters_max_relative_difference"]), ""))
    return rows


def nvidia_train_speed(r):
    rows = []
    for batch, row in sorted(r["by_batch"].items(), key=lambda kv: -int(kv[0])):
        ganc = row.get("ganc", {}).get("sec_per_kimg")
        nvidia = row.get("nvidia", {}).get("sec_per_kimg")
        if ganc and nvidia:
            rows.append((f"s/kimg, per-GPU batch {batch}", f"train.py {nvidia:.2f}", f"{ganc:.2f}",
                         _x(nvidia / ganc)))
        elif ganc:
            rows.append((f"s/kimg, per-GPU batch {batch}", "train.py not measured in this run", f"{ganc:.2f}", ""))
    earlier = r.get("batch4_against_earlier_train_py")
    if earlier:
        rows.append(("s/kimg, per-GPU batch 4, train.py from an earlier call",
                     f"train.py {earlier['nvidia_sec_per_kimg_earlier_call']:.2f}",
                     f"{earlier['ganc_sec_per_kimg']:.2f}", _x(earlier["ganc_speed_up"])))
    return rows


def resample_probe(r):
    rows = []
    for batch, row in r["by_batch"].items():
        ref = row["seconds"]["ref"]
        for name in ("ganc", "plugin"):
            if name in row["seconds"]:
                what = "ganc::upfirdn2d" if name == "ganc" else "NVIDIA's CUDA plugin"
                rows.append((f"upfirdn2d calls of one G and D forward + gradient (batch {batch}), {what}",
                             f"reference {_s(ref)}", _s(row["seconds"][name]), _x(ref / row["seconds"][name])))
    return rows


SUMMARIES = {
    "augment_nvidia": augment_nvidia,
    "augment_nvidia_cuda": augment_nvidia,
    "double_backward_probe": double_backward_probe,
    "fid_speed_standin_fourier": fid_speed,
    "fid_speed_standin_inception": fid_speed,
    "gpu_dcgan64_baselines": gpu_dcgan64_baselines,
    "nvidia_stylegan2_ada": nvidia_stylegan2_ada,
    "nvidia_stylegan3_t": nvidia_stylegan3,
    "nvidia_workflow": nvidia_workflow,
    "nvidia_train_speed": nvidia_train_speed,
    "resample_probe": resample_probe,
    "joint_executor": joint_executor,
}


def summary(name, result):
    """The rows of `result` (bench/results/NAME.json), or None where no function reads it."""
    function = SUMMARIES.get(result.get("benchmark", name))
    return function(result) if function else None
