"""DCGAN-32 with randomness inside the phases: dropout in the discriminator and DiffAugment's
colour augmentation (random brightness, saturation and contrast per image) applied to real
and generated images in both phases. Every draw comes from the rank's phase generator."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .dcgan import DCGAN, two_phase_spec


def augment(x: torch.Tensor) -> torch.Tensor:
    """DiffAugment's 'color' policy (Zhao et al. 2020): differentiable, one draw per image."""
    n = x.size(0)
    x = x + (torch.rand(n, 1, 1, 1, dtype=x.dtype, device=x.device) - 0.5)
    mean = x.mean(dim=1, keepdim=True)
    x = (x - mean) * (torch.rand(n, 1, 1, 1, dtype=x.dtype, device=x.device) * 2) + mean
    mean = x.mean(dim=[1, 2, 3], keepdim=True)
    return (x - mean) * (torch.rand(n, 1, 1, 1, dtype=x.dtype, device=x.device) + 0.5) + mean


class AugmentedDCGAN(DCGAN):
    def __init__(self, dropout: float = 0.2):
        super().__init__(32, 32)
        # Dropout after every LeakyReLU of D.
        layers = []
        for layer in self.discriminator.main:
            layers.append(layer)
            if isinstance(layer, nn.LeakyReLU):
                layers.append(nn.Dropout(dropout))
        self.discriminator.main = nn.Sequential(*layers)

    def phase_d(self, real: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        fake = self.generator(z).detach()
        return (F.softplus(self.discriminator(augment(fake))).mean()
                + F.softplus(-self.discriminator(augment(real))).mean())

    def phase_g(self, z: torch.Tensor) -> torch.Tensor:
        return F.softplus(-self.discriminator(augment(self.generator(z)))).mean()


def ada_augment(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """StyleGAN2-ADA's idea on two of its operations: each image mirrored with probability p
    and, independently, shifted in brightness with probability p (differentiable, so G's step
    learns through it). The draws come from the rank's phase generator."""
    n = x.size(0)
    flip = torch.rand(n, 1, 1, 1, dtype=x.dtype, device=x.device) < p
    x = torch.where(flip, x.flip(3), x)
    shift = (torch.rand(n, 1, 1, 1, dtype=x.dtype, device=x.device) - 0.5) * 0.4
    keep = torch.rand(n, 1, 1, 1, dtype=x.dtype, device=x.device) < p
    return x + torch.where(keep, shift, torch.zeros_like(shift))


class ADADCGAN(DCGAN):
    """DCGAN-32 trained with adaptive augmentation: D sees real and generated images augmented
    with probability p, a controller of the step that follows D's overfitting heuristic
    (the mean of sign(D(real)) against a target), as StyleGAN2-ADA does."""

    def __init__(self):
        super().__init__(32, 32)

    def phase_d(self, real, z, p):
        fake = self.generator(z).detach()
        real_logits = self.discriminator(ada_augment(real, p))
        fake_logits = self.discriminator(ada_augment(fake, p))
        loss = F.softplus(fake_logits).mean() + F.softplus(-real_logits).mean()
        return loss, {"signs_real": real_logits.sign().mean()}

    def phase_g(self, z, p):
        return F.softplus(-self.discriminator(ada_augment(self.generator(z), p))).mean()


def ada_spec(name, batch=16, target=0.6, interval=2, speed_kimg=1.0, initial=0.2):
    """The two-phase DCGAN spec with an ADA controller feeding both phases (ganc_spec 2). The
    tests' speed moves p by 0.032 per adjustment at 2 ranks of 16 (StyleGAN's default, 500 kimg,
    moves it by 0.0001)."""
    spec = two_phase_spec(name, batch, [3, 32, 32], [100, 1, 1])
    p = {"name": "p", "source": "controller", "controller": "augment_p"}
    for phase in spec["phases"]:
        phase["inputs"].append(dict(p))
    return dict(spec, ganc_spec=2, controllers={"augment_p": {
        "type": "ada", "phase": "d", "statistic": "signs_real", "target": target, "interval": interval,
        "speed_kimg": speed_kimg, "initial": initial}})
