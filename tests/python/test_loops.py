"""The loops people write: values handed between the phases of one step.

pix2pix as junyanz/pytorch-CycleGAN-and-pix2pix's `optimize_parameters` trains it (G forward
once; D stepped on the fake detached; G stepped through the same fake, judged by the updated
D), written below in plain PyTorch with DistributedDataParallel, against ganc training the zoo's
pix2pix archive (a section computes the fake, phase d takes it detached, phase g through its
graph). Both draw the same batches and dropout masks, so every all-reduced gradient, the final
parameters and G's BatchNorm statistics agree only if ganc, too, runs G once per step, in
that order.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ganc
from ganc import oracle
from conftest import ROOT, archive
from test_parity import compare, run_ganc, STEPS, SEED

sys.path.insert(0, os.path.join(ROOT, "models"))
from zoo.pix2pix import Pix2Pix  # noqa: E402  (the Python class the archive was exported from)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pairs") / "pairs16.pt")
    subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_data.py"), "pairs", "--size", "16",
                    "-o", path], check=True, stdout=subprocess.DEVNULL)
    return path


class BackwardD(nn.Module):
    """junyanz's backward_D as one DDP forward: D on (A, fake B) detached and on (A, B)."""

    def __init__(self, net_d):
        super().__init__()
        self.net_d = net_d

    def forward(self, real_a, real_b, fake_b):
        criterion = nn.BCEWithLogitsLoss()
        pred_fake = self.net_d(torch.cat((real_a, fake_b), 1).detach())
        loss_d_fake = criterion(pred_fake, torch.zeros_like(pred_fake))
        pred_real = self.net_d(torch.cat((real_a, real_b), 1))
        loss_d_real = criterion(pred_real, torch.ones_like(pred_real))
        return (loss_d_fake + loss_d_real) * 0.5


class BackwardG(nn.Module):
    """junyanz's backward_G as one DDP forward: the (updated, frozen) D on (A, fake B) and L1
    x 100, through the fake computed before the D step. G is a submodule so that this DDP
    all-reduces G's gradients, which reach G only through that fake."""

    def __init__(self, net_g, net_d):
        super().__init__()
        self.net_g, self.net_d = net_g, net_d

    def forward(self, real_a, real_b, fake_b):
        pred_fake = self.net_d(torch.cat((real_a, fake_b), 1))
        loss_g_gan = nn.BCEWithLogitsLoss()(pred_fake, torch.ones_like(pred_fake))
        return loss_g_gan + nn.L1Loss()(fake_b, real_b) * 100.0


def set_requires_grad(net, requires):
    for p in net.parameters():
        p.requires_grad = requires


def grad_norm(net):
    """The L2 norm of a network's all-reduced gradients (ganc's GradNorm/<phase>)."""
    norms = [torch.linalg.vector_norm(p.grad.double()) for p in net.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)).item()


def optimize(step, phase, net, optimizer, loss, norms, out_dir):
    """zero_grad, backward (DDP all-reduces), the gradients written as ganc's --dump-grads
    names them (rank 0), step."""
    optimizer.zero_grad(set_to_none=True)
    loss().backward()
    owner = "discriminator" if phase == "d" else "generator"
    if dist.get_rank() == 0:
        torch.save({f"{owner}.{n}": p.grad.clone() for n, p in net.named_parameters()},
                   os.path.join(out_dir, f"grads_step{step}_{phase}.pt"))
    norms[phase].append(grad_norm(net))
    optimizer.step()


def reference_rank(rank, world, port, path, data_path, out_dir):
    """One rank of pix2pix's reference loop (optimize_parameters) under DDP, on ganc's input
    streams: DistributedSampler batches, ganc's seed for the randomness inside the phases."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = Pix2Pix()
    model.load_state_dict(torch.jit.load(path).state_dict())
    model.train()
    net_g, net_d = model.generator, model.discriminator
    spec = ganc.load_spec(path)
    data, _ = oracle._load_data(data_path, spec)
    inputs = oracle.Inputs(spec, data, rank, world, SEED)
    torch.manual_seed(SEED + oracle.PHASE_SEED_OFFSET + rank)  # dropout draws, as ganc seeds them
    adam = dict(lr=2e-4, betas=(0.5, 0.999), foreach=False)
    optimizer_g, optimizer_d = torch.optim.Adam(net_g.parameters(), **adam), torch.optim.Adam(net_d.parameters(), **adam)
    set_requires_grad(net_g, False)
    backward_d = DDP(BackwardD(net_d), find_unused_parameters=True, broadcast_buffers=False)
    set_requires_grad(net_g, True)
    set_requires_grad(net_d, False)
    backward_g = DDP(BackwardG(net_g, net_d), find_unused_parameters=True, broadcast_buffers=False)
    set_requires_grad(net_d, True)
    norms = {"d": [], "g": []}
    for step in range(STEPS):
        pair, _ = inputs.batch()
        real_a, real_b = pair[:, :3], pair[:, 3:]
        fake_b = net_g(real_a)  # forward(): once per step
        set_requires_grad(net_d, True)
        optimize(step, "d", net_d, optimizer_d, lambda: backward_d(real_a, real_b, fake_b), norms, out_dir)
        set_requires_grad(net_d, False)
        optimize(step, "g", net_g, optimizer_g, lambda: backward_g(real_a, real_b, fake_b), norms, out_dir)
    if rank == 0:
        final = {n: t.detach().clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
        torch.save(final, os.path.join(out_dir, "params_final.pt"))
        with open(os.path.join(out_dir, "grad_norms.json"), "w") as f:
            json.dump(norms, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


@pytest.mark.parametrize("world", [1, 2])
def test_pix2pix_matches_its_reference_loop(ganc_bin, pairs, tmp_path, world):
    """Every all-reduced gradient of D and G, the final parameters and every buffer (G's and D's
    BatchNorm statistics, which a second G forward per step would move) equal to the reference
    loop's, which runs G once per step; the plan shows the fake's graph followed into G."""
    got_dir = run_ganc(ganc_bin, "pix2pix", pairs, world, str(tmp_path))
    ref_dir = str(tmp_path / "reference")
    os.makedirs(ref_dir)
    mp.spawn(reference_rank, args=(world, oracle.free_port(), archive("pix2pix"), pairs, ref_dir),
             nprocs=world, join=True)
    compare("pix2pix", got_dir, ref_dir)
    buffers = [n for n in torch.load(os.path.join(ref_dir, "params_final.pt")) if "running_mean" in n]
    assert any(n.startswith("generator.") for n in buffers), buffers  # compared above
    plan = subprocess.run([ganc_bin, "compile", archive("pix2pix"), "--emit", "report"], capture_output=True,
                          text=True, check=True).stdout
    assert "backward continues into section 'forward'" in plan
    d_phase = plan[plan.index("phase d:"):plan.index("phase g:")]
    assert "generator." not in d_phase.split("not updated here")[0]  # D's step uses no G parameter


def test_pix2pix_matches_the_eager_oracle(ganc_bin, pairs, tmp_path):
    """ganc.oracle (the generic eager DDP reference) reads sections and handed-on values as
    ganc does: the same numbers from the spec alone."""
    got_dir = run_ganc(ganc_bin, "pix2pix", pairs, 2, str(tmp_path))
    ref_dir = str(tmp_path / "ddp")
    oracle.run(archive("pix2pix"), pairs, 2, STEPS, SEED, out_dir=ref_dir)
    compare("pix2pix", got_dir, ref_dir)
