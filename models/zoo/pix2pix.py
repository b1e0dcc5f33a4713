"""pix2pix (Isola et al.) as junyanz/pytorch-CycleGAN-and-pix2pix trains it: a U-Net
generator with dropout, a PatchGAN discriminator on (input, output) pairs, the vanilla GAN
loss and L1 x 100. Its `optimize_parameters` computes the fake once per step
(`forward()`), steps D on `fake.detach()`, then steps G through that same fake, judged by
the updated D. Here `forward_fake` is that forward, a section of the step; `phase_d` takes the
fake detached and `phase_g` through its graph. A sample has two fields, the input A and the
target B (make_data.py pairs; pix2pix's own A|B images load with `"layout": "side_by_side"`)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class UNet(nn.Module):
    """A two-level U-Net (pix2pix's `unet_*` generators, shortened): strided convolutions
    down, transposed convolutions up with dropout, skip connections by concatenation; no bias
    before a batch norm, as pix2pix builds them."""

    def __init__(self, ch=16):
        super().__init__()
        self.down1 = nn.Conv2d(3, ch, 4, 2, 1)
        self.down2 = nn.Sequential(nn.LeakyReLU(0.2), nn.Conv2d(ch, ch * 2, 4, 2, 1, bias=False),
                                   nn.BatchNorm2d(ch * 2))
        self.up2 = nn.Sequential(nn.ReLU(), nn.ConvTranspose2d(ch * 2, ch, 4, 2, 1, bias=False),
                                 nn.BatchNorm2d(ch),
                                 nn.Dropout(0.5))
        self.up1 = nn.Sequential(nn.ReLU(), nn.ConvTranspose2d(ch * 2, 3, 4, 2, 1), nn.Tanh())

    def forward(self, a):
        d1 = self.down1(a)
        d2 = self.down2(d1)
        return self.up1(torch.cat([d1, self.up2(d2)], 1))


class PatchGAN(nn.Module):
    """pix2pix's `basic` discriminator, shortened: 4x4 convolutions to a map of patch logits."""

    def __init__(self, ch=16):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(6, ch, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(ch, ch * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * 2), nn.LeakyReLU(0.2),
            nn.Conv2d(ch * 2, 1, 3, 1, 1))

    def forward(self, ab):
        return self.main(ab)


class Pix2Pix(nn.Module):
    def __init__(self, ch=16, lambda_l1: float = 100.0):
        super().__init__()
        self.generator = UNet(ch)
        self.discriminator = PatchGAN(ch)
        self.lambda_l1 = lambda_l1

    @staticmethod
    def gan_loss(logits, real: bool):
        target = torch.ones_like(logits) if real else torch.zeros_like(logits)
        return F.binary_cross_entropy_with_logits(logits, target)

    def forward_fake(self, a):
        """junyanz's forward(): fake_B = netG(real_A)."""
        return {"fake_b": self.generator(a)}

    def phase_d(self, a, b, fake_b):
        """backward_D: D on (A, fake B) detached and on (A, B), halved."""
        loss_fake = self.gan_loss(self.discriminator(torch.cat([a, fake_b], 1)), False)
        loss_real = self.gan_loss(self.discriminator(torch.cat([a, b], 1)), True)
        return (loss_fake + loss_real) * 0.5

    def phase_g(self, a, b, fake_b):
        """backward_G: the updated D on (A, fake B), plus L1 to B, through the step's fake."""
        loss_gan = self.gan_loss(self.discriminator(torch.cat([a, fake_b], 1)), True)
        loss_l1 = F.l1_loss(fake_b, b) * self.lambda_l1
        return loss_gan + loss_l1, {"loss_G_GAN": loss_gan.detach(), "loss_G_L1": loss_l1.detach()}

    def sample_rows(self, a, b):
        """The grid: a row per pair, input A | G(A) | target B (in training mode, as pix2pix's
        test.py draws by default: dropout on)."""
        return a, self.generator(a), b


def pix2pix_spec(name, batch=8, size=16):
    adam = {"type": "adam", "lr": 2e-4, "betas": [0.5, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    a = {"name": "a", "source": "data", "field": "A"}
    b = {"name": "b", "source": "data", "field": "B"}
    field = [3, size, size]
    return {
        "ganc_spec": 2, "name": name, "batch_size": batch,
        "data": {"fields": [{"name": "A", "shape": field}, {"name": "B", "shape": field}]},
        "phases": [
            {"name": "forward", "method": "forward_fake", "outputs": ["fake_b"], "inputs": [a]},
            {"name": "d", "method": "phase_d", "updates": ["discriminator"],
             "inputs": [a, b, {"name": "fake_b", "source": "output", "output": "forward.fake_b"}]},
            {"name": "g", "method": "phase_g", "updates": ["generator"],
             "inputs": [a, b, {"name": "fake_b", "source": "output", "output": "forward.fake_b",
                               "detach": False}]},
        ],
        "optimizers": {"generator": dict(adam), "discriminator": dict(adam)},
        "sample": {"method": "sample_rows", "inputs": [a, b], "mode": "train"},
    }
