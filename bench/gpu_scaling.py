"""Predicted scaling of the zoo's GANs on GPU clusters, from a profile measured on this GPU.

For each model (default: DCGAN-64 and the zoo's small StyleGAN2, as bench_gpu.py runs them,
and StyleGAN2 at full size, StyleGAN2-ADA's 256-pixel configuration: 49M parameters): one
`ganc run --device cuda --profile` on this machine's GPU (every phase captured and replayed;
CUDA events inside the graphs say when each bucket's gradients were ready), then
`ganc simulate` at each world size with the default links (NVLink within 8-GPU hosts,
InfiniBand between them; `--link` for another), beside StyleGAN3's schedule (one flat
all-reduce after backward). Prints, per model and world size, the predicted step time, the
communication left exposed and the efficiency (batch per GPU fixed) of both schedules, and
the bucket caps `ganc compile --bucket-cap-mb auto` picks for the largest world size.

    python3 bench/gpu_scaling.py [--models dcgan64,stylegan2,stylegan2_256] [--gpus 1,8,64,512,1024]
                                 [--steps 96] [--link ib] [--json PATH] [--markdown PATH]
                                 [--device cpu]

`--device cpu` profiles on the CPU instead: a check of the script itself on a machine without
a GPU (its numbers are a CPU's compute on GPU links, not a prediction for GPUs).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

from results import GANC, ROOT  # noqa: E402  (first: python/ and models/ on sys.path)

import torch  # noqa: E402

import ganc  # noqa: E402
import zoo  # noqa: E402



def mib(nbytes):
    return "one bucket" if nbytes >= 1 << 50 else f"{nbytes / (1 << 20):g} MiB"


def run(*args):
    r = subprocess.run([GANC, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ganc {args[0]}: " + (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1])
    return r.stdout


def profile_model(model, steps, device, tmp):
    """Exports, compiles and trains `model` on `device` with --profile; returns (archive, plan,
    profile path)."""
    gan, spec = zoo.build(model)
    archive, plan = os.path.join(tmp, model + ".pt"), os.path.join(tmp, model + ".plan")
    ganc.export(gan, archive, spec)
    run("compile", archive, "-o", plan)
    size = spec["data"]["shape"][-1]
    data = os.path.join(tmp, f"digits{size}.pt")
    if not os.path.exists(data):
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), "digits", "-o", data,
                        "--size", str(size)], check=True, stdout=subprocess.DEVNULL)
    profile = os.path.join(tmp, model + ".profile.json")
    fallback = os.environ.get("GANC_GPU_TRAIN_ARGS", "").split()  # scripts/gpu_check.sh's, if any
    run("run", "--nproc", "1", plan, "--model", archive, "--data", data, *fallback, "--device", device,
        "--steps", str(steps), "--out", os.path.join(tmp, model + "_run"), "--sample-every", "0",
        "--checkpoint-every", "0", "--log-every", str(steps), "--warmup", "3", "--force",
        "--tensorboard", "off", "--profile", profile)
    return archive, plan, profile


def markdown(results):
    """The predictions as a Markdown table (the scaling table of the GPU notes)."""
    out = [f"Predicted from one {results['device']} (torch {results['torch']}, {results['date']}); 8 GPUs "
           f"per host on NVLink, {results['link']} between hosts; batch per GPU fixed.", "",
           "| model | GPUs | ganc ms/step | exposed ms | efficiency | flat all-reduce ms/step | exposed ms "
           "| efficiency |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model, m in results["models"].items():
        if "error" in m:
            out.append(f"| {model} | fails: {m['error']} | | | | | | |")
            continue
        for i, r in enumerate(m["predictions"]):
            out.append(f"| {model if i == 0 else ''} | {r['ranks']} | {r['step_seconds'] * 1e3:.2f} | "
                       f"{r['exposed_seconds'] * 1e3:.2f} | {r['efficiency'] * 100:.1f} % | "
                       f"{r['flat_step_seconds'] * 1e3:.2f} | {r['flat_exposed_seconds'] * 1e3:.2f} | "
                       f"{r['flat_efficiency'] * 100:.1f} % |")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="dcgan64,stylegan2,stylegan2_256")
    parser.add_argument("--gpus", default="1,8,64,512,1024")
    parser.add_argument("--steps", type=int, default=96,
                        help="profiled run's steps (StyleGAN2's R1 phase runs every 16: it is warmed up, "
                             "captured and replayed by step 80)")
    parser.add_argument("--link", default="ib", help="the link between hosts (ganc simulate --link)")
    parser.add_argument("--json", help="also write every number here")
    parser.add_argument("--markdown", help="also write the predictions here as a Markdown table")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: check the script without a GPU (not a GPU prediction)")
    args = parser.parse_args()
    if args.device == "cpu":
        device = "CPU (a check of the script, not a GPU prediction)"
    elif torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    else:
        sys.exit("gpu_scaling.py needs a CUDA GPU (the profile is measured on it); --device cpu checks the script")
    largest = max(int(n) for n in args.gpus.split(","))
    results = {"device": device, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
               "link": args.link, "models": {}}
    lines = [f"\npredicted from one {device} (torch {torch.__version__}, {results['date']}); "
             f"8 GPUs per host on NVLink, {args.link} between hosts"]
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            try:
                archive, plan, profile = profile_model(model, args.steps, args.device, tmp)
            except RuntimeError as e:  # one model's failure leaves the others' predictions
                results["models"][model] = {"error": str(e)}
                lines.append(f"\n{model}: fails: {e}")
                print(lines[-1], file=sys.stderr, flush=True)
                continue
            rows = json.loads(run("simulate", plan, "--profile", profile, "--gpus", args.gpus,
                                  "--link", args.link, "--json"))
            tuned = os.path.join(tmp, model + ".tuned.plan")
            run("compile", archive, "-o", tuned, "--bucket-cap-mb", "auto", "--target-gpus", str(largest),
                "--profile", profile, "--link", args.link)
            facts = json.loads(run("explain", tuned, "--json"))
            measured = json.load(open(profile))
            tuned_keys = ("name", "bucket_cap_bytes", "first_bucket_cap_bytes", "tuned_exposed_seconds",
                          "default_exposed_seconds")
            results["models"][model] = {"profile": measured, "predictions": rows,
                                        "autotuned": [{k: ph[k] for k in tuned_keys} for ph in facts["phases"]]}
            compute = sum(ph["forward_backward_seconds"] * ph["runs"] / measured["steps"]
                          for ph in measured["phases"])
            lines.append(f"\n{model}, batch {zoo.build(model)[1]['batch_size']} per GPU; profiled forward+"
                         f"backward {compute * 1e3:.3f} ms per step")
            lines.append(f"{'GPUs':>6} {'ganc ms':>9} {'exposed':>9} {'eff.':>7}   "
                         f"{'flat ms':>9} {'exposed':>9} {'eff.':>7}")
            for r in rows:
                lines.append(f"{r['ranks']:>6} {r['step_seconds'] * 1e3:9.3f} {r['exposed_seconds'] * 1e3:9.3f} "
                             f"{r['efficiency'] * 100:6.1f}%   {r['flat_step_seconds'] * 1e3:9.3f} "
                             f"{r['flat_exposed_seconds'] * 1e3:9.3f} {r['flat_efficiency'] * 100:6.1f}%")
            for ph in facts["phases"]:
                lines.append(f"  autotuned for {largest} GPUs, {ph['name']}: first bucket "
                             f"{mib(ph['first_bucket_cap_bytes'])}, then {mib(ph['bucket_cap_bytes'])}; exposed "
                             f"{ph['tuned_exposed_seconds'] * 1e3:.3f} ms (DDP's 25 MiB caps: "
                             f"{ph['default_exposed_seconds'] * 1e3:.3f} ms)")
            # Progress on stderr; the whole table once on stdout at the end.
            print("\n".join(lines[-(len(rows) + 2 + len(facts['phases'])):]), file=sys.stderr, flush=True)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results))
    failed = [m for m, r in results["models"].items() if "error" in r]
    if failed:
        sys.exit(f"gpu_scaling.py: {', '.join(failed)} failed (see above); the others' predictions are written")


if __name__ == "__main__":
    main()
