"""CycleGAN on images as junyanz/pytorch-CycleGAN-and-pix2pix's `optimize_parameters` trains it:
the four images of `forward()` (fake B, its reconstruction, fake A, its reconstruction)
computed once per step in a section; the G step (both generators) through them, with the
identity losses and the frozen discriminators; then the D step on fakes drawn from an image
history pool of 50 per discriminator (Shrivastava et al.), detached. The pools are buffers
updated inside the D phase with its own random draws, so they are checkpointed and a resumed
run continues them exactly. A sample has two fields, an image of each domain, A and B
(make_data.py pairs), as CycleGAN's unaligned loader gives one image of each."""
from __future__ import annotations

from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F


class ImagePool(nn.Module):
    """junyanz's ImagePool as tensors: the first `size` fakes fill it and are returned; after
    that each fake, with probability 1/2, is stored in place of a random stored image, which is
    returned instead; otherwise it is returned itself."""

    def __init__(self, size: int, shape):
        super().__init__()
        self.size = size
        self.register_buffer("images", torch.zeros([size] + list(shape)))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def query(self, images: torch.Tensor) -> torch.Tensor:
        out: List[torch.Tensor] = []
        for i in range(images.size(0)):
            image = images[i].detach()
            stored = int(self.count)
            if stored < self.size:
                self.images[stored] = image
                self.count.add_(1)
                out.append(image)
            elif float(torch.rand([1])) > 0.5:
                j = int(torch.randint(0, self.size, [1]))
                old = self.images[j].clone()
                self.images[j] = image
                out.append(old)
            else:
                out.append(image)
        return torch.stack(out)


def resnet_generator(ch=16):
    """CycleGAN's `resnet` generator, shortened to three convolutions with instance norm. (No
    bias before a norm: the norm removes it, and its gradient is rounding noise that no
    comparison could check.)"""
    return nn.Sequential(
        nn.Conv2d(3, ch, 3, 1, 1, bias=False), nn.InstanceNorm2d(ch), nn.ReLU(),
        nn.Conv2d(ch, ch, 3, 1, 1, bias=False), nn.InstanceNorm2d(ch), nn.ReLU(),
        nn.Conv2d(ch, 3, 3, 1, 1), nn.Tanh())


def patch_discriminator(ch=16):
    return nn.Sequential(
        nn.Conv2d(3, ch, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(ch, ch * 2, 4, 2, 1, bias=False), nn.InstanceNorm2d(ch * 2), nn.LeakyReLU(0.2),
        nn.Conv2d(ch * 2, 1, 3, 1, 1))


class CycleGANPool(nn.Module):
    def __init__(self, ch=16, size=16, pool=50, lambda_a=10.0, lambda_b=10.0, lambda_identity=0.5):
        super().__init__()
        self.gen_ab, self.gen_ba = resnet_generator(ch), resnet_generator(ch)
        self.disc_a, self.disc_b = patch_discriminator(ch), patch_discriminator(ch)
        self.pool_a, self.pool_b = ImagePool(pool, [3, size, size]), ImagePool(pool, [3, size, size])
        self.lambda_a, self.lambda_b, self.lambda_identity = lambda_a, lambda_b, lambda_identity

    @staticmethod
    def gan_loss(prediction, real: bool):
        """CycleGAN's default least-squares GAN loss."""
        target = torch.ones_like(prediction) if real else torch.zeros_like(prediction)
        return F.mse_loss(prediction, target)

    def forward_images(self, a, b):
        """junyanz's forward(), in its order (which sets the order backward sums each
        generator's gradients from its three uses)."""
        fake_b = self.gen_ab(a)
        rec_a = self.gen_ba(fake_b)
        fake_a = self.gen_ba(b)
        rec_b = self.gen_ab(fake_a)
        return {"fake_b": fake_b, "rec_a": rec_a, "fake_a": fake_a, "rec_b": rec_b}

    def phase_g(self, a, b, fake_b, rec_a, fake_a, rec_b):
        """backward_G: identity, adversarial (frozen D) and cycle losses."""
        idt_a = F.l1_loss(self.gen_ab(b), b) * self.lambda_b * self.lambda_identity
        idt_b = F.l1_loss(self.gen_ba(a), a) * self.lambda_a * self.lambda_identity
        adv_a = self.gan_loss(self.disc_b(fake_b), True)
        adv_b = self.gan_loss(self.disc_a(fake_a), True)
        cycle_a = F.l1_loss(rec_a, a) * self.lambda_a
        cycle_b = F.l1_loss(rec_b, b) * self.lambda_b
        return adv_a + adv_b + cycle_a + cycle_b + idt_a + idt_b

    def phase_d(self, a, b, fake_b, fake_a):
        """backward_D_A and backward_D_B: each D on real images and on fakes from its pool."""
        fake_b = self.pool_b.query(fake_b)
        loss_b = (self.gan_loss(self.disc_b(b), True) + self.gan_loss(self.disc_b(fake_b.detach()), False)) * 0.5
        fake_a = self.pool_a.query(fake_a)
        loss_a = (self.gan_loss(self.disc_a(a), True) + self.gan_loss(self.disc_a(fake_a.detach()), False)) * 0.5
        return loss_b + loss_a


def cyclegan_pool_spec(name, batch=8, size=16):
    adam = {"type": "adam", "lr": 2e-4, "betas": [0.5, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    pair = [{"name": "a", "source": "data", "field": "A"}, {"name": "b", "source": "data", "field": "B"}]
    field = [3, size, size]

    def take(value, detach=True):
        return dict({"name": value, "source": "output", "output": "forward." + value},
                    **({} if detach else {"detach": False}))

    return {
        "ganc_spec": 2, "name": name, "batch_size": batch,
        "data": {"fields": [{"name": "A", "shape": field}, {"name": "B", "shape": field}]},
        "phases": [
            {"name": "forward", "method": "forward_images", "inputs": pair,
             "outputs": ["fake_b", "rec_a", "fake_a", "rec_b"]},
            {"name": "g", "method": "phase_g", "updates": ["gen_ab", "gen_ba"],
             "inputs": pair + [take(v, detach=False) for v in ("fake_b", "rec_a", "fake_a", "rec_b")]},
            {"name": "d", "method": "phase_d", "updates": ["disc_a", "disc_b"],
             "inputs": pair + [take("fake_b"), take("fake_a")]},
        ],
        "optimizers": {"generators": dict(adam, params=["gen_ab", "gen_ba"]),
                       "discriminators": dict(adam, params=["disc_a", "disc_b"])},
    }
