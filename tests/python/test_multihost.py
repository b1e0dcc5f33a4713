"""Two hosts for real: ranks in two network namespaces joined by a veth pair, started by
torchrun on each "host" exactly as docs/usage.md's two-node example does, training over Gloo
across that link; the weights must equal a one-host run of the same world size.

Needs root (CAP_NET_ADMIN) and `ip`; elsewhere it is skipped, saying why.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import archive, compile_plan

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
STEPS = 4


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def two_hosts():
    """Namespaces ganc-h0-PID (10.77.0.1, device v0-PID) and ganc-h1-PID (10.77.0.2, v1-PID),
    removed afterwards (removing a namespace removes its end of the pair)."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command to create network namespaces")
    tag = str(os.getpid())
    hosts = [f"ganc-h{i}-{tag}" for i in range(2)]
    devices = [f"v{i}-{tag}"[:15] for i in range(2)]
    made = []
    try:
        for host in hosts:
            result = _ip("netns", "add", host, check=False)
            if result.returncode != 0:
                pytest.skip(f"cannot create network namespaces here: {result.stderr.strip()}")
            made.append(host)
        _ip("link", "add", devices[0], "type", "veth", "peer", "name", devices[1])
        for i, (host, device) in enumerate(zip(hosts, devices)):
            _ip("link", "set", device, "netns", host)
            _ip("-n", host, "addr", "add", f"10.77.0.{i + 1}/24", "dev", device)
            _ip("-n", host, "link", "set", device, "up")
            _ip("-n", host, "link", "set", "lo", "up")
        yield [(host, device, f"10.77.0.{i + 1}") for i, (host, device) in enumerate(zip(hosts, devices))]
    finally:
        for host in made:
            _ip("netns", "del", host, check=False)


@pytest.mark.parametrize("per_host", [1, 2])
def test_two_hosts_train_like_one(ganc_bin, datasets, tmp_path, two_hosts, per_host):
    if not os.path.exists(TORCHRUN):
        pytest.skip(f"{TORCHRUN} is not installed")
    model, data = "dcgan32", datasets["digits"]
    plan = compile_plan(ganc_bin, model, str(tmp_path))
    world = 2 * per_host
    common = ["--data", data, "--steps", str(STEPS), "--seed", "3", "--sample-every", "0",
              "--checkpoint-every", str(STEPS), "--log-every", str(STEPS), "--tensorboard", "off",
              "--threads", "1", "--timeout-s", "60"]
    master = two_hosts[0][2]
    nodes = []
    for node, (host, device, address) in enumerate(two_hosts):
        env = dict(os.environ, GLOO_SOCKET_IFNAME=device)
        nodes.append(subprocess.Popen(
            ["ip", "netns", "exec", host, TORCHRUN, "--nnodes", "2", "--nproc-per-node", str(per_host),
             "--node-rank", str(node), "--master-addr", master, "--master-port", "29517",
             "--no-python", ganc_bin, "train", plan, "--model", archive(model),
             "--out", str(tmp_path / "two-hosts"), *common],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [n.communicate(timeout=300)[0] for n in nodes]
    for node, (n, out) in enumerate(zip(nodes, outputs)):
        assert n.returncode == 0, f"node {node}:\n{out}"
    assert f"training dcgan32: {world} ranks (cpu, Gloo)" in outputs[0]

    subprocess.run([ganc_bin, "run", "--nproc", str(world), plan, "--model", archive(model),
                    "--out", str(tmp_path / "one-host"), *common], check=True, capture_output=True)
    apart = torch.load(tmp_path / "two-hosts" / "checkpoint.pt", weights_only=False)
    together = torch.load(tmp_path / "one-host" / "checkpoint.pt", weights_only=False)
    assert apart["step"] == together["step"] == STEPS
    for sub in ("generator", "discriminator"):
        for name, value in together[sub].items():
            assert torch.equal(apart[sub][name], value), f"{sub}.{name} differs"
