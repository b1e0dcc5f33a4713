"""DCGAN-32 with randomness inside the phases: dropout in the discriminator and DiffAugment's
colour augmentation (random brightness, saturation and contrast per image) applied to real
and generated images in both phases. Every draw comes from the rank's phase generator."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .dcgan import DCGAN


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
