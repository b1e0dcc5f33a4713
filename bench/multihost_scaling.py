"""Checks `ganc simulate`'s link between hosts against two emulated hosts on this machine.

Two network namespaces joined by a veth pair whose both ends are shaped to a fixed rate (a
token bucket, `tc ... tbf`), so the link between the two "hosts" is slow enough that the
all-reduces, not the host's scheduling, set the step time:

1. Measures Gloo's all-reduce across the link (one rank in each namespace): alpha from 4
   KiB, beta from the slope between 1 and 2 MiB (t = 2 alpha + B / beta at 2 ranks; mean
   times, see scaling.time_all_reduces).
2. Profiles each model on one rank (`ganc train --profile`, one thread, no link).
3. Predicts 2 hosts x 1 rank and 2 hosts x 2 ranks with `ganc simulate` (those alpha and
   beta between hosts; each emulated host gets half of this machine's cores), then trains
   both with torchrun in the namespaces, exactly as docs/usage.md's two-node command, profiled,
   and prints predicted against measured step time and exposed communication.
4. Autotunes the buckets for each shape (`ganc compile --bucket-cap-mb auto` with the same
   links) and, where the caps differ from DDP's, trains the tuned plan too: the predicted
   saving against the measured one.

Needs root (network namespaces, tc) and torchrun.

    python3 bench/multihost_scaling.py [--rate-mbit 200] [--steps 30] [--models dcgan32,stylegan2,mlp]
"""
import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from results import GANC, ROOT  # noqa: E402  (first: python/ and models/ on sys.path)

import scaling  # noqa: E402  (this folder: the link measurement and the profile reading)

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
DATA = {"mlp": "ring", "dcgan32": "digits", "stylegan2": "digits"}
# Steps per run, at least: StyleGAN2's R1 phase runs every 16 steps.
MIN_STEPS = {"stylegan2": 48}
LINK_SIZES = [4 << 10, 256 << 10, 1 << 20, 2 << 20]


def sh(*args):
    return subprocess.run(list(args), capture_output=True, text=True, check=True)


@contextlib.contextmanager
def shaped_hosts(rate_mbit):
    """Yields [(namespace, device, address)] for two namespaces joined by a veth pair shaped
    to `rate_mbit` each way; removes them afterwards."""
    tag = str(os.getpid())
    names = [(f"ganc-s{i}-{tag}", f"s{i}-{tag}"[:15], f"10.78.0.{i + 1}") for i in range(2)]
    try:
        for ns, _, _ in names:
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", names[0][1], "type", "veth", "peer", "name", names[1][1])
        for ns, dev, address in names:
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", address + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # Egress of each end: both directions of the link run at the rate. The bucket holds
            # 1 ms of the rate (at least 32 KiB): a larger one would send part of every
            # all-reduce at the veth's own speed after each compute pause.
            burst_kb = max(32, rate_mbit * 1000 // 8 // 1000)
            sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
               "burst", f"{burst_kb}kb", "latency", "500ms")
        yield names
    finally:
        for ns, _, _ in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def link_worker(rank, master, port, result):
    """One rank of the link measurement (run inside its namespace)."""
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    scaling.time_all_reduces(LINK_SIZES, 4, result)
    dist.destroy_process_group()


def measure_link(hosts, tmp):
    """(alpha seconds, beta bytes/s) of Gloo's all-reduce across the link, one rank per host."""
    result = os.path.join(tmp, "link.json")
    procs = []
    for rank, (ns, dev, _) in enumerate(hosts):
        env = dict(os.environ, GLOO_SOCKET_IFNAME=dev)
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__, "--link-worker",
                                       str(rank), hosts[0][2], "29531", result], env=env))
    for p in procs:
        if p.wait(timeout=300) != 0:
            sys.exit("the link measurement failed")
    return scaling.fit_alpha_beta(result, LINK_SIZES)


def train_two_hosts(hosts, per_host, plan, archive, data, steps, tmp):
    """Mean step seconds and exposed communication of `plan` on 2 hosts x `per_host`."""
    name = f"{os.path.basename(plan)}-2x{per_host}"
    out, profile = os.path.join(tmp, name), os.path.join(tmp, name + ".profile.json")
    nodes = []
    for node, (ns, dev, _) in enumerate(hosts):
        env = dict(os.environ, GLOO_SOCKET_IFNAME=dev)
        nodes.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, TORCHRUN, "--nnodes", "2", "--nproc-per-node", str(per_host),
             "--node-rank", str(node), "--master-addr", hosts[0][2], "--master-port", "29532",
             "--no-python", GANC, "train", plan, "--model", archive, "--data", data, "--steps", str(steps),
             "--seed", "0", "--out", out, "--force", "--threads", "1", "--sample-every", "0", "--checkpoint-every", "0",
             "--log-every", str(steps), "--tensorboard", "off", "--timeout-s", "120", "--profile", profile],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for node, n in enumerate(nodes):
        output = n.communicate(timeout=900)[0]
        if n.returncode != 0:
            sys.exit(f"node {node} failed:\n{output}")
    return scaling.step_and_exposed(out, profile, steps)


def autotuned(model, per_host, archive, plan, profile, links, hosts, data, steps, rounds, tmp):
    """Compiles `model` with autotuned caps for 2 hosts x `per_host` and, where its buckets
    differ from `plan`'s, trains both plans there in alternation, `rounds` times each (a slow
    spell of the host then lands on both). Returns the row for the autotune table."""
    tuned = os.path.join(tmp, f"{model}-tuned-{per_host}.plan")
    subprocess.run([GANC, "compile", archive, "-o", tuned, "--bucket-cap-mb", "auto", "--target-gpus",
                    str(2 * per_host), "--profile", profile, *links], check=True, capture_output=True)

    def facts(path):
        return json.loads(subprocess.run([GANC, "explain", path, "--json"], check=True, capture_output=True,
                                         text=True).stdout)["phases"]

    phases = facts(tuned)
    changed = [ph for ph, default in zip(phases, facts(plan)) if ph["buckets"] != default["buckets"]]
    caps = ", ".join(f"{ph['name']} {ph['first_bucket_cap_bytes'] >> 10}/{ph['bucket_cap_bytes'] >> 10} KiB"
                     if ph["bucket_cap_bytes"] < 1 << 50 else f"{ph['name']} one bucket" for ph in changed)
    # Per step, as ganc simulate weighs phases: by their runs per step in the profile.
    p = json.load(open(profile))
    weight = {ph["key"]: ph["runs"] / p["steps"] for ph in p["phases"]}
    row = {"model": model, "shape": f"2 x {per_host}", "caps": caps or "DDP's",
           "predicted": sum(ph["tuned_exposed_seconds"] * weight.get(ph["name"], 0) for ph in phases),
           "default": sum(ph["default_exposed_seconds"] * weight.get(ph["name"], 0) for ph in phases)}
    if changed:
        steps_of = {"default": [], "tuned": []}
        for _ in range(rounds):
            for name, path in (("default", plan), ("tuned", tuned)):
                steps_of[name].append(train_two_hosts(hosts, per_host, path, archive, data, steps, tmp)[0])
        row.update({name + "_step": statistics.median(v) for name, v in steps_of.items()})
        row["ratios"] = [t / d for d, t in zip(steps_of["default"], steps_of["tuned"])]
    return row


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--link-worker":
        link_worker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate-mbit", type=int, default=200)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--models", default="dcgan32,stylegan2,mlp")
    parser.add_argument("--ab-rounds", type=int, default=3,
                        help="runs of each plan where autotuning changed the caps (alternating)")
    args = parser.parse_args()
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            sys.exit(f"multihost_scaling.py needs `{tool}`")
    if not os.path.exists(TORCHRUN):
        sys.exit(f"multihost_scaling.py needs torchrun ({TORCHRUN})")
    import ganc
    import zoo
    cores_per_host = (os.cpu_count() or 1) / 2
    rows, tuned = [], []
    with tempfile.TemporaryDirectory() as tmp, shaped_hosts(args.rate_mbit) as hosts:
        alpha, beta = measure_link(hosts, tmp)
        print(f"link between the namespaces shaped to {args.rate_mbit} Mbit/s: Gloo all-reduce alpha "
              f"{alpha * 1e6:.0f} us, beta {beta / 1e6:.1f} MB/s; {cores_per_host:g} cores per host", flush=True)
        for model in args.models.split(","):
            steps = max(args.steps, MIN_STEPS.get(model, 0))
            data = os.path.join(tmp, DATA[model] + ".pt")
            subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), DATA[model], "-o", data],
                           check=True, stdout=subprocess.DEVNULL)
            gan, spec = zoo.build(model)
            archive, plan = os.path.join(tmp, model + ".pt"), os.path.join(tmp, model + ".plan")
            ganc.export(gan, archive, spec)
            subprocess.run([GANC, "compile", archive, "-o", plan], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            profile = os.path.join(tmp, model + ".profile.json")
            subprocess.run([GANC, "run", "--nproc", "1", plan, "--model", archive, "--data", data, "--steps",
                            str(steps), "--seed", "0", "--out", os.path.join(tmp, "one"), "--force",
                            "--threads", "1", "--sample-every", "0", "--checkpoint-every", "0", "--log-every",
                            str(steps), "--tensorboard", "off", "--profile", profile],
                           check=True, stdout=subprocess.DEVNULL)
            one, _ = scaling.step_and_exposed(os.path.join(tmp, "one"), profile, steps)
            for per_host in (1, 2):
                links = ["--ranks-per-host", str(per_host), "--alpha-us", str(alpha * 1e6),
                         "--bandwidth-gbps", str(beta / 1e9)]
                predicted = json.loads(subprocess.run(
                    [GANC, "simulate", plan, "--profile", profile, "--gpus", str(2 * per_host),
                     "--cores-per-host", str(cores_per_host), *links, "--json"],
                    check=True, capture_output=True, text=True).stdout)[0]
                measured, exposed = train_two_hosts(hosts, per_host, plan, archive, data, steps, tmp)
                rows.append((model, f"2 x {per_host}", one, predicted, measured, exposed))
                print(f"[bench] {model} 2 x {per_host}: predicted {predicted['step_seconds'] * 1e3:.1f} ms, "
                      f"measured {measured * 1e3:.1f} ms", flush=True)
                tuned.append(autotuned(model, per_host, archive, plan, profile, links, hosts, data, steps,
                                       args.ab_rounds, tmp))
    print(f"\npredicted against measured, two hosts joined by {args.rate_mbit} Mbit/s, one thread per rank")
    print(f"{'model':10} {'hosts x ranks':>13} {'1 rank ms':>10} {'predicted ms':>13} {'measured ms':>12} "
          f"{'error':>8}   {'exposed: predicted ms':>21} {'measured ms':>12} {'flat all-reduce ms':>19}")
    for model, shape, one, p, measured, exposed in rows:
        print(f"{model:10} {shape:>13} {one * 1e3:10.2f} {p['step_seconds'] * 1e3:13.2f} {measured * 1e3:12.2f} "
              f"{100 * (p['step_seconds'] - measured) / measured:7.1f}%   {p['exposed_seconds'] * 1e3:21.2f} "
              f"{exposed * 1e3:12.2f} {p['flat_step_seconds'] * 1e3:19.2f}")
    print("\nautotuned buckets (ganc compile --bucket-cap-mb auto, the same links) against DDP's caps; "
          f"measured: median of {args.ab_rounds} alternating runs of each")
    print(f"{'model':10} {'hosts x ranks':>13}  {'exposed: predicted ms':>21} {'DDP caps ms':>12}   "
          f"{'step: DDP caps ms':>17} {'tuned ms':>9} {'tuned/DDP per round':>20}   changed caps (first/rest)")
    for r in tuned:
        measured = (f"{r['default_step'] * 1e3:17.2f} {r['tuned_step'] * 1e3:9.2f} "
                    f"{' '.join(f'{x:.3f}' for x in r['ratios']):>20}") if "ratios" in r else f"{'(same plan)':>48}"
        print(f"{r['model']:10} {r['shape']:>13}  {r['predicted'] * 1e3:21.2f} {r['default'] * 1e3:12.2f}   "
              f"{measured}   {r['caps']}")


if __name__ == "__main__":
    main()
