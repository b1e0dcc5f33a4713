"""Spectral normalisation with power-iteration buffers updated in forward."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .mlp import MLPGAN


class SNLinear(nn.Module):
    """Linear layer with spectral normalisation (Miyato et al.), scriptable: one power
    iteration per call in training mode; `u` is a buffer updated in forward."""

    def __init__(self, fin: int, fout: int):
        super().__init__()
        self.linear = nn.Linear(fin, fout)
        self.register_buffer("u", F.normalize(torch.randn(fout), dim=0))

    def forward(self, x):
        w = self.linear.weight
        with torch.no_grad():
            v = F.normalize(torch.mv(w.t(), self.u), dim=0, eps=1e-12)
            if self.training:
                self.u.copy_(F.normalize(torch.mv(w, v), dim=0, eps=1e-12))
                v = F.normalize(torch.mv(w.t(), self.u), dim=0, eps=1e-12)
            # Snapshots: the next call's update of u must not touch what this backward saved.
            u = self.u.clone()
            v = v.clone()
        sigma = torch.dot(u, torch.mv(w, v))
        return F.linear(x, w / sigma, self.linear.bias)


class SNDiscriminator(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.l1 = SNLinear(2, hidden)
        self.l2 = SNLinear(hidden, hidden)
        self.l3 = SNLinear(hidden, 1)

    def forward(self, x):
        h = F.leaky_relu(self.l1(x), 0.1)
        h = F.leaky_relu(self.l2(h), 0.1)
        return self.l3(h)


class SNGAN(MLPGAN):
    """SNGAN: hinge loss, spectrally normalised discriminator."""

    def __init__(self):
        super().__init__()
        self.discriminator = SNDiscriminator()

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        return F.relu(1.0 + self.discriminator(fake)).mean() + F.relu(1.0 - self.discriminator(real)).mean()

    def phase_g(self, z):
        return -self.discriminator(self.generator(z)).mean()


class TorchSNDCGAN(nn.Module):
    """DCGAN-32 written the usual way, with PyTorch's own reparametrisations: the
    discriminator's convolutions under `torch.nn.utils.spectral_norm` (the hook API) and its
    last one under `torch.nn.utils.parametrizations.spectral_norm`; the generator's first and
    last transposed convolutions under `parametrizations.weight_norm`. Hinge loss (SNGAN)."""

    def __init__(self, width: int = 32, z_dim: int = 100):
        super().__init__()
        from torch.nn.utils import spectral_norm
        from torch.nn.utils.parametrizations import spectral_norm as sn, weight_norm as wn
        from .dcgan import DCGANDiscriminator, DCGANGenerator
        self.generator = DCGANGenerator(32, z_dim, width)
        self.discriminator = DCGANDiscriminator(32, width)
        g, d = self.generator.main, self.discriminator.main
        g[0] = wn(g[0])
        g[len(g) - 2] = wn(g[len(g) - 2])
        convs = [i for i, m in enumerate(d) if isinstance(m, nn.Conv2d)]
        for i in convs[:-1]:
            d[i] = spectral_norm(d[i])
        d[convs[-1]] = sn(d[convs[-1]])

    def phase_d(self, real: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        fake = self.generator(z).detach()
        return F.relu(1.0 + self.discriminator(fake)).mean() + F.relu(1.0 - self.discriminator(real)).mean()

    def phase_g(self, z: torch.Tensor) -> torch.Tensor:
        return -self.discriminator(self.generator(z)).mean()
