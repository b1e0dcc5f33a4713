"""A class-conditional DCGAN with a projection discriminator."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .dcgan import DCGAN, DCGANGenerator, two_phase_spec


class ConditionalGenerator(nn.Module):
    """DCGAN generator whose input is the noise concatenated with a learned class embedding."""

    def __init__(self, classes=10, embed=16, z_dim=100, width=32):
        super().__init__()
        self.embed = nn.Embedding(classes, embed)
        self.body = DCGANGenerator(32, z_dim + embed, width)

    def forward(self, z, y):
        e = self.embed(y).view(y.size(0), -1, 1, 1)
        return self.body(torch.cat([z, e], 1))


class ProjectionDiscriminator(nn.Module):
    """Projection discriminator (Miyato & Koyama): D(x, y) = psi(phi(x)) + <embed(y), phi(x)>."""

    def __init__(self, classes=10, width=32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(width, width * 2, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(width * 2, width * 4, 4, 2, 1), nn.LeakyReLU(0.2))
        self.psi = nn.Linear(width * 4 * 16, 1)
        self.embed = nn.Embedding(classes, width * 4 * 16)

    def forward(self, x, y):
        phi = self.features(x).flatten(1)
        return self.psi(phi).squeeze(1) + (self.embed(y) * phi).sum(1)


class ConditionalDCGAN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.generator = ConditionalGenerator(classes)
        self.discriminator = ProjectionDiscriminator(classes)

    def phase_d(self, real, labels, z, fake_labels):
        fake = self.generator(z, fake_labels).detach()
        return (F.softplus(self.discriminator(fake, fake_labels)).mean()
                + F.softplus(-self.discriminator(real, labels)).mean())

    def phase_g(self, z, fake_labels):
        return F.softplus(-self.discriminator(self.generator(z, fake_labels), fake_labels)).mean()


def conditional_spec(name, batch=32, classes=10):
    z = {"name": "z", "source": "normal", "shape": [100, 1, 1]}
    y = {"name": "fake_labels", "source": "categorical"}
    spec = two_phase_spec(name, batch, [3, 32, 32], [100, 1, 1])
    spec["data"]["classes"] = classes
    spec["phases"][0]["inputs"] = [{"name": "real", "source": "data"},
                                   {"name": "labels", "source": "labels"}, z, y]
    spec["phases"][1]["inputs"] = [z, y]
    spec["sample"] = {"submodule": "generator", "noise_shape": [100, 1, 1], "classes": classes}
    return spec
