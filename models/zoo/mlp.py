"""The MLP GAN on 2-D points: the small base several zoo GANs extend."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .dcgan import two_phase_spec


# A small MLP GAN on 2-D points (a ring of Gaussians).

def mlp(sizes, act):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


class MLPGenerator(nn.Module):
    def __init__(self, z_dim=8, hidden=64):
        super().__init__()
        self.net = mlp([z_dim, hidden, hidden, 2], nn.ReLU)

    def forward(self, z):
        return self.net(z)


class MLPDiscriminator(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.net = mlp([2, hidden, hidden, 1], lambda: nn.LeakyReLU(0.2))

    def forward(self, x):
        return self.net(x)


class MLPGAN(nn.Module):
    def __init__(self, z_dim=8, hidden=64):
        super().__init__()
        self.generator = MLPGenerator(z_dim, hidden)
        self.discriminator = MLPDiscriminator(hidden)

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()

    def phase_g(self, z):
        return F.softplus(-self.discriminator(self.generator(z))).mean()


def mlp_spec(name, batch=64):
    spec = two_phase_spec(name, batch, [2], [8], lr=1e-3, betas=(0.5, 0.999))
    return spec


class MLPGANStats(MLPGAN):
    """The MLP GAN whose D step also logs D's mean score on real and fake points and its
    loss again (stats.jsonl, TensorBoard), as StyleGAN's training loop reports scores."""

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        d_fake, d_real = self.discriminator(fake), self.discriminator(real)
        loss = F.softplus(d_fake).mean() + F.softplus(-d_real).mean()
        return loss, {"D_real": d_real.mean(), "D_fake": d_fake.mean(), "loss": loss}
