"""The loops people write: values handed between the phases of one step, state carried across
steps inside the module.

pix2pix as junyanz/pytorch-CycleGAN-and-pix2pix's `optimize_parameters` trains it (G forward
once; D stepped on the fake detached; G stepped through the same fake, judged by the updated
D), written below in plain PyTorch with DistributedDataParallel, against ganc training the zoo's
pix2pix archive (a section computes the fake, phase d takes it detached, phase g through its
graph). Both draw the same batches and dropout masks, so every all-reduced gradient, the final
parameters and G's BatchNorm statistics agree only if ganc, too, runs G once per step, in
that order.
"""
import io
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch
from PIL import Image
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ganc
from ganc import reference
from conftest import ROOT, archive, assert_equal
from test_parity import compare, run_ganc, STEPS, SEED

sys.path.insert(0, os.path.join(ROOT, "models"))
from zoo.cyclegan_pool import CycleGANPool  # noqa: E402  (the Python classes the archives were exported from)
from zoo.pix2pix import Pix2Pix  # noqa: E402


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


def optimize(step, phase, named, optimizer, loss, norms, out_dir):
    """zero_grad, backward (DDP all-reduces), the gradients of `named` ({qualified name:
    parameter}) written as ganc's --dump-grads names them (rank 0), their norm, step."""
    optimizer.zero_grad(set_to_none=True)
    loss().backward()
    if dist.get_rank() == 0:
        torch.save({n: p.grad.clone() for n, p in named.items()}, os.path.join(out_dir, f"grads_step{step}_{phase}.pt"))
    norms.setdefault(phase, []).append(
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.double()) for p in named.values()])).item())
    optimizer.step()


def named(model, *owners):
    return {n: p for n, p in model.named_parameters() if n.split(".")[0] in owners}


def start_rank(rank, world, port, path, data_path, model):
    """Joins the group; `model` with the archive's weights, in training mode; ganc's input
    streams (DistributedSampler batches) and its seed for randomness inside the phases."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model.load_state_dict(torch.jit.load(path).state_dict())
    model.train()
    spec = ganc.load_spec(path)
    data, _ = reference.load_data(data_path, spec)
    torch.manual_seed(SEED + reference.PHASE_SEED_OFFSET + rank)
    return reference.Inputs(spec, data, rank, world, SEED)


def finish_rank(rank, model, norms, out_dir):
    if rank == 0:
        final = {n: t.detach().clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
        torch.save(final, os.path.join(out_dir, "params_final.pt"))
        with open(os.path.join(out_dir, "grad_norms.json"), "w") as f:
            json.dump(norms, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def adam(*nets):
    return torch.optim.Adam([p for net in nets for p in net.parameters()], lr=2e-4, betas=(0.5, 0.999),
                            foreach=False)


def pix2pix_rank(rank, world, port, path, data_path, out_dir):
    """One rank of pix2pix's reference loop (optimize_parameters) under DDP."""
    model = Pix2Pix()
    inputs = start_rank(rank, world, port, path, data_path, model)
    net_g, net_d = model.generator, model.discriminator
    optimizer_g, optimizer_d = adam(net_g), adam(net_d)
    set_requires_grad(net_g, False)
    backward_d = DDP(BackwardD(net_d), find_unused_parameters=True, broadcast_buffers=False)
    set_requires_grad(net_g, True)
    set_requires_grad(net_d, False)
    backward_g = DDP(BackwardG(net_g, net_d), find_unused_parameters=True, broadcast_buffers=False)
    set_requires_grad(net_d, True)
    norms = {}
    for step in range(STEPS):
        pair, _ = inputs.batch()
        real_a, real_b = pair[:, :3], pair[:, 3:]
        fake_b = net_g(real_a)  # forward(): once per step
        set_requires_grad(net_d, True)
        optimize(step, "d", named(model, "discriminator"), optimizer_d,
                 lambda: backward_d(real_a, real_b, fake_b), norms, out_dir)
        set_requires_grad(net_d, False)
        optimize(step, "g", named(model, "generator"), optimizer_g,
                 lambda: backward_g(real_a, real_b, fake_b), norms, out_dir)
    finish_rank(rank, model, norms, out_dir)


@pytest.mark.parametrize("world", [1, 2])
def test_pix2pix_matches_its_reference_loop(ganc_bin, pairs, tmp_path, world):
    """Every all-reduced gradient of D and G, the final parameters and every buffer (G's and D's
    BatchNorm statistics, which a second G forward per step would move) equal to the reference
    loop's, which runs G once per step; the plan shows the fake's graph followed into G, and the
    step captured as one graph on CUDA."""
    got_dir = run_ganc(ganc_bin, "pix2pix", pairs, world, str(tmp_path))
    ref_dir = str(tmp_path / "reference")
    os.makedirs(ref_dir)
    mp.spawn(pix2pix_rank, args=(world, reference.free_port(), archive("pix2pix"), pairs, ref_dir),
             nprocs=world, join=True)
    compare("pix2pix", got_dir, ref_dir)
    buffers = [n for n in torch.load(os.path.join(ref_dir, "params_final.pt")) if "running_mean" in n]
    assert any(n.startswith("generator.") for n in buffers), buffers  # compared above
    plan = subprocess.run([ganc_bin, "compile", archive("pix2pix"), "--emit", "report"], capture_output=True,
                          text=True, check=True).stdout
    assert "backward continues into section 'forward'" in plan
    # On CUDA the section and both phases are captured together, as one graph.
    assert plan.count("replay on CUDA: CUDA Graph, one with the phases and sections it shares values with") == 2
    d_phase = plan[plan.index("phase d:"):plan.index("phase g:")]
    assert "generator." not in d_phase.split("not updated here")[0]  # D's step uses no G parameter


def test_pix2pix_matches_the_eager_oracle(ganc_bin, pairs, tmp_path):
    """ganc.reference (the generic eager DDP reference) reads sections and handed-on values as
    ganc does: the same numbers from the spec alone."""
    got_dir = run_ganc(ganc_bin, "pix2pix", pairs, 2, str(tmp_path))
    ref_dir = str(tmp_path / "ddp")
    reference.run(archive("pix2pix"), pairs, 2, STEPS, SEED, out_dir=ref_dir)
    compare("pix2pix", got_dir, ref_dir)


class CycleBackwardG(nn.Module):
    """junyanz's backward_G for CycleGAN as one DDP forward: identity losses (new G calls),
    the frozen discriminators on the fakes and the cycle losses, through forward()'s images."""

    def __init__(self, model):
        super().__init__()
        self.gen_ab, self.gen_ba, self.disc_a, self.disc_b = model.gen_ab, model.gen_ba, model.disc_a, model.disc_b

    def forward(self, real_a, real_b, fake_b, rec_a, fake_a, rec_b):
        gan, l1 = nn.MSELoss(), nn.L1Loss()
        loss_idt_a = l1(self.gen_ab(real_b), real_b) * 10.0 * 0.5
        loss_idt_b = l1(self.gen_ba(real_a), real_a) * 10.0 * 0.5
        pred_b, pred_a = self.disc_b(fake_b), self.disc_a(fake_a)
        loss_g_a = gan(pred_b, torch.ones_like(pred_b))
        loss_g_b = gan(pred_a, torch.ones_like(pred_a))
        loss_cycle_a = l1(rec_a, real_a) * 10.0
        loss_cycle_b = l1(rec_b, real_b) * 10.0
        return loss_g_a + loss_g_b + loss_cycle_a + loss_cycle_b + loss_idt_a + loss_idt_b


class CycleBackwardD(nn.Module):
    """backward_D_A and backward_D_B as one DDP forward (they step one optimizer): each
    discriminator on real images and on a fake drawn from its history pool, detached."""

    def __init__(self, model):
        super().__init__()
        self.disc_a, self.disc_b, self.pool_a, self.pool_b = model.disc_a, model.disc_b, model.pool_a, model.pool_b

    @staticmethod
    def basic(net_d, real, fake):
        gan = nn.MSELoss()
        pred_real, pred_fake = net_d(real), net_d(fake.detach())
        return (gan(pred_real, torch.ones_like(pred_real)) + gan(pred_fake, torch.zeros_like(pred_fake))) * 0.5

    def forward(self, real_a, real_b, fake_b, fake_a):
        loss_d_a = self.basic(self.disc_b, real_b, self.pool_b.query(fake_b))
        loss_d_b = self.basic(self.disc_a, real_a, self.pool_a.query(fake_a))
        return loss_d_a + loss_d_b


def cyclegan_rank(rank, world, port, path, data_path, out_dir):
    """One rank of CycleGAN's reference loop (optimize_parameters) under DDP."""
    model = CycleGANPool()
    inputs = start_rank(rank, world, port, path, data_path, model)
    gens, discs = (model.gen_ab, model.gen_ba), (model.disc_a, model.disc_b)
    optimizer_g, optimizer_d = adam(*gens), adam(*discs)
    set_requires_grad(model, False)
    for net in gens:
        set_requires_grad(net, True)
    backward_g = DDP(CycleBackwardG(model), find_unused_parameters=True, broadcast_buffers=False)
    set_requires_grad(model, False)
    for net in discs:
        set_requires_grad(net, True)
    backward_d = DDP(CycleBackwardD(model), find_unused_parameters=True, broadcast_buffers=False)
    for net in gens:
        set_requires_grad(net, True)
    norms = {}
    for step in range(STEPS):
        pair, _ = inputs.batch()
        real_a, real_b = pair[:, :3], pair[:, 3:]
        fake_b = model.gen_ab(real_a)  # forward(): once per step
        rec_a = model.gen_ba(fake_b)
        fake_a = model.gen_ba(real_b)
        rec_b = model.gen_ab(fake_a)
        for net in discs:
            set_requires_grad(net, False)
        optimize(step, "g", named(model, "gen_ab", "gen_ba"), optimizer_g,
                 lambda: backward_g(real_a, real_b, fake_b, rec_a, fake_a, rec_b), norms, out_dir)
        for net in discs:
            set_requires_grad(net, True)
        optimize(step, "d", named(model, "disc_a", "disc_b"), optimizer_d,
                 lambda: backward_d(real_a, real_b, fake_b, fake_a), norms, out_dir)
    finish_rank(rank, model, norms, out_dir)


def test_cyclegan_with_history_pools_matches_its_reference_loop(ganc_bin, pairs, tmp_path):
    """CycleGAN at 2 ranks against junyanz's optimize_parameters under DDP: G through the four
    images of the step's one forward, D on fakes from image pools of 50 filled and then swapped
    at random (from step 7 at batch 8): gradients, parameters and each rank-0 pool equal."""
    got_dir = run_ganc(ganc_bin, "cyclegan_pool", pairs, 2, str(tmp_path))
    ref_dir = str(tmp_path / "reference")
    os.makedirs(ref_dir)
    mp.spawn(cyclegan_rank, args=(2, reference.free_port(), archive("cyclegan_pool"), pairs, ref_dir), nprocs=2,
             join=True)
    compare("cyclegan_pool", got_dir, ref_dir)
    final = torch.load(os.path.join(ref_dir, "params_final.pt"))
    assert final["pool_a.count"].item() == 50  # full, so the swaps ran


def test_a_resumed_cyclegan_continues_its_pools_exactly(ganc_bin, pairs, tmp_path):
    """Stopped at step 5 (the pools half full) and resumed to 12 (past full: swaps drawn from
    the checkpointed generator), at 2 ranks: the checkpoint equals that of a run never stopped,
    every rank's pools and random state included, bit for bit."""
    plan = str(tmp_path / "plan.ganc")
    subprocess.run([ganc_bin, "compile", archive("cyclegan_pool"), "-o", plan], check=True,
                   stdout=subprocess.DEVNULL)

    def train(out, steps, *extra):
        subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", archive("cyclegan_pool"), "--data", pairs,
                        "--steps", str(steps), "--seed", str(SEED), "--out", out, "--sample-every", "0",
                        "--log-every", "100", *extra], check=True, timeout=600, stdout=subprocess.DEVNULL)
        return ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))

    straight = train(str(tmp_path / "straight"), 12)
    train(str(tmp_path / "resumed"), 5)
    resumed = train(str(tmp_path / "resumed"), 12, "--resume", "auto")
    assert [b["pool_a.count"].item() for b in straight["rank_buffers"]] == [50, 50]
    assert set(straight) == set(resumed)
    for key in set(straight) - {"format", "version", "identity", "spec"}:
        assert_equal(straight[key], resumed[key], key)


def test_pix2pix_samples_show_input_output_and_target_rows(ganc_bin, pairs, tmp_path):
    """The grid from the spec's sampling method: a row per data sample, A | G(A) | B, the
    data set's first samples; drawn in training mode (dropout on) with every buffer put back,
    so a run that draws samples every 2 steps ends with the checkpoint of one that draws none."""
    plan = str(tmp_path / "plan.ganc")
    subprocess.run([ganc_bin, "compile", archive("pix2pix"), "-o", plan], check=True, stdout=subprocess.DEVNULL)

    def train(out, *extra):
        subprocess.run([ganc_bin, "train", plan, "--model", archive("pix2pix"), "--data", pairs, "--steps", "4",
                        "--seed", str(SEED), "--out", out, "--log-every", "100", *extra], check=True, timeout=300,
                       stdout=subprocess.DEVNULL)
        return ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))

    sampled = train(str(tmp_path / "sampled"), "--sample-every", "2", "--samples", "5")
    assert_equal(sampled, train(str(tmp_path / "plain"), "--sample-every", "0"), "checkpoint")
    grid = torch.from_numpy(__import__("numpy").asarray(Image.open(str(tmp_path / "sampled" / "samples.png"))))
    size, pad = 16, 2
    assert tuple(grid.shape) == (5 * (size + pad) + pad, 3 * (size + pad) + pad, 3)
    fields = torch.load(pairs)
    data = torch.cat([fields["A"], fields["B"]], 1)[:5].float()  # A in channels 0-2, B in 3-5

    def cell(row, column):
        top, left = pad + row * (size + pad), pad + column * (size + pad)
        return grid[top:top + size, left:left + size].permute(2, 0, 1).float()

    def pixels(images):
        return ((images.clamp(-1, 1) + 1) * 127.5).round()

    for row in range(5):
        assert (cell(row, 0) - pixels(data[row, :3])).abs().max() <= 1, f"row {row}: not the input A"
        assert (cell(row, 2) - pixels(data[row, 3:])).abs().max() <= 1, f"row {row}: not the target B"
        assert (cell(row, 1) - pixels(data[row, 3:])).abs().max() > 1, f"row {row}: G(A) is the target itself"


def side_by_side_images(fields, folder, count):
    """pix2pix's own data layout: each pair as one PNG, A | B left to right, in a zip laid out
    as StyleGAN's dataset_tool writes it (unlabelled). Returns the zip and the fields as
    the 8-bit images hold them, scaled to [-1, 1] as ganc scales pixels."""
    pixels = {k: ((v[:count].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8) for k, v in fields.items()}
    path = os.path.join(folder, "pairs.zip")
    with zipfile.ZipFile(path, "w") as z:
        for i in range(count):
            wide = torch.cat([pixels["A"][i], pixels["B"][i]], 2).permute(1, 2, 0).numpy()
            buf = io.BytesIO()
            Image.fromarray(wide).save(buf, format="png")
            z.writestr(f"00000/img{i:08d}.png", buf.getvalue())
        z.writestr("dataset.json", json.dumps({"labels": None}))
    return path, {k: v.float() / 127.5 - 1 for k, v in pixels.items()}


def test_side_by_side_pairs_train_as_their_fields_mirrored_together(ganc_bin, pairs, tmp_path):
    """pix2pix's A|B images in a zip, split by `"layout": "side_by_side"` into the fields A
    and B, the set doubled by xflip: ganc at 2 ranks trains as eager DDP (ganc.reference) on a
    tensor file of the same fields, mirrored one by one. Loaded as one image, mirroring would
    swap A and B."""
    zip_path, quantised = side_by_side_images(torch.load(pairs), str(tmp_path), 64)
    torch.save(quantised, str(tmp_path / "fields.pt"))
    spec = ganc.load_spec(archive("pix2pix"))
    spec["data"].update(layout="side_by_side", xflip=True)
    model = Pix2Pix()
    model.load_state_dict(torch.jit.load(archive("pix2pix")).state_dict())
    path = str(tmp_path / "pix2pix_pairs.pt")
    ganc.export(model, path, spec, verbose=False)
    got_dir = run_ganc(ganc_bin, "pix2pix", zip_path, 2, str(tmp_path), path=path)
    ref_dir = str(tmp_path / "ddp")
    reference.run(path, str(tmp_path / "fields.pt"), 2, STEPS, SEED, out_dir=ref_dir)
    compare("pix2pix", got_dir, ref_dir, path=path)


def test_data_without_a_field_is_refused_naming_it(ganc_bin, pairs, tmp_path):
    """A data file lacking a field of the spec, and images with no layout for fields: one line
    each, before training."""
    plan = str(tmp_path / "plan.ganc")
    subprocess.run([ganc_bin, "compile", archive("pix2pix"), "-o", plan], check=True, stdout=subprocess.DEVNULL)
    only_a = str(tmp_path / "only_a.pt")
    torch.save({"A": torch.load(pairs)["A"]}, only_a)
    images = str(tmp_path / "images")
    os.makedirs(images)
    for i in range(16):
        Image.fromarray(torch.zeros(16, 16, 3, dtype=torch.uint8).numpy()).save(os.path.join(images, f"{i}.png"))
    for data, says in ((only_a, "field 'B' is missing"), (images, "set 'data.layout' to \"side_by_side\"")):
        done = subprocess.run([ganc_bin, "train", plan, "--model", archive("pix2pix"), "--data", data, "--steps",
                               "1", "--out", str(tmp_path / "run")], capture_output=True, text=True)
        assert done.returncode != 0, done.stdout
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], done.stderr


def test_metrics_need_a_generator_on_noise(ganc_bin, pairs, tmp_path):
    """--metrics scores a generator on noise: a sample method that takes the data (pix2pix's
    rows of real images) is refused before any step, in one line."""
    plan = str(tmp_path / "plan.ganc")
    subprocess.run([ganc_bin, "compile", archive("pix2pix"), "-o", plan], check=True, stdout=subprocess.DEVNULL)
    done = subprocess.run([ganc_bin, "train", plan, "--model", archive("pix2pix"), "--data", pairs, "--steps", "1",
                           "--out", str(tmp_path / "run"), "--metrics", "fid1k"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "the spec's `sample` method 'sample_rows' takes '" in done.stderr, done.stderr
    assert "from the data; the metrics call it on noise and class ids only" in done.stderr, done.stderr
    assert not os.path.exists(tmp_path / "run" / "checkpoint.pt")
    # A generator on noise, but samples of two fields: no real images to compare with.
    spec = ganc.load_spec(archive("pix2pix"))
    spec["sample"] = {"submodule": "generator", "noise_shape": [3, 16, 16]}
    model = Pix2Pix()
    path = str(tmp_path / "on_noise.pt")
    ganc.export(model, path, spec, verbose=False)
    subprocess.run([ganc_bin, "compile", path, "-o", plan], check=True, stdout=subprocess.DEVNULL)
    done = subprocess.run([ganc_bin, "train", plan, "--model", path, "--data", pairs, "--steps", "1",
                           "--out", str(tmp_path / "run"), "--metrics", "fid1k"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "samples have 2 fields" in done.stderr, done.stderr


def test_ada_p_follows_its_rule_and_resumes_exactly(ganc_bin, datasets, tmp_path):
    """dcgan32_ada at 2 ranks: p (an input of both phases, read by their augmentation) adjusted
    every 2 steps from the mean over both ranks of the sign(D(real)) phase d logs. ganc's p after
    every step (stats.jsonl) equals the eager reference's StyleGAN2-ADA rule, p falls to the
    clamp at 0 and climbs again, and every
    gradient (which depends on p through the augmentation's draws) matches eager DDP. Stopped
    at step 5, mid-interval, and resumed to 10, the checkpoint equals the uninterrupted run's."""
    plan = str(tmp_path / "plan.ganc")
    subprocess.run([ganc_bin, "compile", archive("dcgan32_ada"), "-o", plan], check=True, stdout=subprocess.DEVNULL)

    def train(out, steps, *extra):
        subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", archive("dcgan32_ada"), "--data",
                        datasets["digits"], "--steps", str(steps), "--seed", str(SEED), "--out", out,
                        "--sample-every", "0", "--log-every", "1", *extra], check=True, timeout=600,
                       stdout=subprocess.DEVNULL)
        return ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))

    # (Logged every step, for p: the gradient norms' check, which reads one record of the
    # whole run from <dumps>/../train, has none to read.)
    straight = train(str(tmp_path / "run"), STEPS, "--dump-grads", str(tmp_path / "ganc"))
    ref_dir = str(tmp_path / "ddp")
    reference.run(archive("dcgan32_ada"), datasets["digits"], 2, STEPS, SEED, out_dir=ref_dir)
    compare("dcgan32_ada", str(tmp_path / "ganc"), ref_dir)
    with open(os.path.join(ref_dir, "controllers.json")) as f:
        expected = json.load(f)["augment_p"]
    with open(tmp_path / "run" / "stats.jsonl") as f:
        got = [json.loads(line)["Controller/augment_p"] for line in f]
    assert got == pytest.approx(expected, rel=0, abs=1e-7), (got, expected)
    moves = [b - a for a, b in zip([0.05] + expected, expected)]
    assert 0.0 in expected and any(m < 0 for m in moves) and any(m > 0 for m in moves), \
        f"p did not fall to the clamp at 0 and climb again: {expected}"
    train(str(tmp_path / "resumed"), 5)
    resumed = train(str(tmp_path / "resumed"), STEPS, "--resume", "auto")
    assert set(straight) == set(resumed) and "controllers" in straight
    for key in set(straight) - {"format", "version", "identity", "spec"}:
        assert_equal(straight[key], resumed[key], key)


def test_a_controller_reading_a_value_its_phase_does_not_log_is_refused(ganc_bin, tmp_path):
    """`ganc compile` runs the controller's phase once: a statistic it does not log is one line
    naming the controller, the value and the method, before any training."""
    sys.path.insert(0, os.path.join(ROOT, "models"))
    from zoo import build
    gan, spec = build("dcgan32_ada")
    spec["controllers"]["augment_p"]["statistic"] = "signs_fake"
    path = str(tmp_path / "ada.pt")
    ganc.export(gan, path, spec, verbose=False)
    done = subprocess.run([ganc_bin, "compile", path, "-o", str(tmp_path / "plan.ganc")], capture_output=True,
                          text=True)
    assert done.returncode == 2, done.stderr
    assert "controller 'augment_p' reads 'signs_fake', which method 'phase_d' does not log" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


class PenaltyHandsOn(nn.Module):
    """A D step with R1 that hands its fake on to the G step (as a loop that computes the fake
    once per step does), and a G step that pulls its new fake towards the one D saw."""

    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def phase_d(self, real, z):
        fake = self.generator(z)
        x = real.detach().requires_grad_(True)
        logits = self.discriminator(x)
        grads = torch.autograd.grad([logits.sum()], [x], create_graph=True)[0]
        assert grads is not None
        loss = F.softplus(self.discriminator(fake.detach())).mean() + F.softplus(-logits).mean()
        return loss + grads.square().sum(1).mean(), {"fake": fake}

    def phase_g(self, z, seen):
        fake = self.generator(z)
        return F.softplus(-self.discriminator(fake)).mean() + (fake - seen).square().mean()


def test_a_phase_with_a_gradient_penalty_hands_values_on(ganc_bin, datasets, tmp_path):
    """`ganc compile` runs a phase that hands values on to get them for the phases that take
    them: with gradients where the phase differentiates (it ran under no_grad, so R1's
    autograd.grad failed: "element 0 of tensors does not require grad"). It compiles and trains
    at 2 ranks like eager DDP."""
    z = {"name": "z", "source": "normal", "shape": [2]}
    spec = {"ganc_spec": 2, "name": "penalty_hands_on", "batch_size": 8, "data": {"shape": [2]},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["discriminator"], "outputs": ["fake"],
                        "inputs": [{"name": "real", "source": "data"}, z]},
                       {"name": "g", "method": "phase_g", "updates": ["generator"],
                        "inputs": [z, {"name": "seen", "source": "output", "output": "d.fake"}]}],
            "optimizers": {"generator": {"type": "adam", "lr": 1e-3}, "discriminator": {"type": "adam", "lr": 1e-3}}}
    torch.manual_seed(0)
    path = str(tmp_path / "penalty.pt")
    ganc.export(PenaltyHandsOn(), path, spec, verbose=False)
    got_dir = run_ganc(ganc_bin, None, datasets["ring"], 2, str(tmp_path), path=path)
    ref_dir = str(tmp_path / "ddp")
    reference.run(path, datasets["ring"], 2, STEPS, SEED, out_dir=ref_dir, reducer={"d": "manual"})
    compare(None, got_dir, ref_dir, path=path)
