"""BigGAN's class-conditional generator at 32x32 (Brock et al.): residual up-blocks whose batch
norms are conditional (BatchNorm2d without affine parameters, scaled and shifted per class) and
synchronised over the ranks (BigGAN's cross-replica batch norm), a projection discriminator
and the hinge loss."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .conditional import ProjectionDiscriminator
from .dcgan import two_phase_spec


class ConditionalBatchNorm2d(nn.Module):
    """BigGAN's conditional batch norm: batch statistics without the layer's own affine
    parameters (`affine=False`), then a gain of 1 + gain(y) and a bias of bias(y), both class
    embeddings that start at zero."""

    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, affine=False)
        self.gain = nn.Embedding(classes, channels)
        self.bias = nn.Embedding(classes, channels)
        nn.init.zeros_(self.gain.weight)
        nn.init.zeros_(self.bias.weight)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        gain = (1 + self.gain(y)).view(y.size(0), -1, 1, 1)
        return self.bn(x) * gain + self.bias(y).view(y.size(0), -1, 1, 1)


class GBlock(nn.Module):
    """BigGAN's up-block: conditional batch norm, ReLU, 2x nearest upsampling, 3x3 convolution,
    conditional batch norm, ReLU, 3x3 convolution; a 1x1 convolution of the upsampled input
    beside them. No convolution has a bias: every path from one to the image passes a batch
    norm, which removes a per-channel constant (its gradient would be zero)."""

    def __init__(self, cin: int, cout: int, classes: int):
        super().__init__()
        self.bn1 = ConditionalBatchNorm2d(cin, classes)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.bn2 = ConditionalBatchNorm2d(cout, classes)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.skip = nn.Conv2d(cin, cout, 1, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(F.relu(self.bn1(x, y)), scale_factor=2.0, mode="nearest")
        h = self.conv2(F.relu(self.bn2(self.conv1(h), y)))
        return h + self.skip(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class BigGANGenerator(nn.Module):
    def __init__(self, classes: int = 10, z_dim: int = 64, width: int = 32):
        super().__init__()
        self.width = width
        self.linear = nn.Linear(z_dim, 4 * 4 * 4 * width)
        self.blocks = nn.ModuleList([GBlock(4 * width, 4 * width, classes), GBlock(4 * width, 2 * width, classes),
                                     GBlock(2 * width, width, classes)])
        self.bn = nn.BatchNorm2d(width)
        self.out = nn.Conv2d(width, 3, 3, 1, 1)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.linear(z).view(z.size(0), 4 * self.width, 4, 4)
        for block in self.blocks:
            h = block(h, y)
        return torch.tanh(self.out(F.relu(self.bn(h))))


class BigGAN(nn.Module):
    def __init__(self, classes: int = 10, z_dim: int = 64, width: int = 32):
        super().__init__()
        self.generator = BigGANGenerator(classes, z_dim, width)
        self.discriminator = ProjectionDiscriminator(classes, width)

    def phase_d(self, real, labels, z, fake_labels):
        fake = self.generator(z, fake_labels).detach()
        return F.relu(1 - self.discriminator(real, labels)).mean() + F.relu(1 + self.discriminator(fake, fake_labels)).mean()

    def phase_g(self, z, fake_labels):
        return -self.discriminator(self.generator(z, fake_labels), fake_labels).mean()


def biggan_spec(name: str, batch: int = 32, classes: int = 10, z_dim: int = 64):
    """BigGAN's optimizers (Adam with betas (0, 0.999); D at 2e-4, G at 5e-5) and its
    cross-replica batch norm: every batch norm of the generator synchronised (ganc_spec 2)."""
    spec = two_phase_spec(name, batch, [3, 32, 32], [z_dim])
    spec["ganc_spec"] = 2
    spec["data"]["classes"] = classes
    z = {"name": "z", "source": "normal", "shape": [z_dim]}
    y = {"name": "fake_labels", "source": "categorical"}
    spec["phases"][0]["inputs"] = [{"name": "real", "source": "data"}, {"name": "labels", "source": "labels"}, z, y]
    spec["phases"][1]["inputs"] = [z, y]
    for sub, lr in (("discriminator", 2e-4), ("generator", 5e-5)):
        spec["optimizers"][sub].update(lr=lr, betas=[0.0, 0.999])
    spec["sync_batch_norm"] = ["generator"]
    spec["sample"] = {"submodule": "generator", "noise_shape": [z_dim], "classes": classes}
    return spec
