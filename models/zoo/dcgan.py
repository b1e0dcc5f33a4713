"""DCGAN (Radford et al.) at 32x32 and 64x64, and the two-phase (d, g) spec most zoo GANs use."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# DCGAN (Radford et al.): ConvTranspose2d + BatchNorm + ReLU generator, Conv2d + LeakyReLU
# discriminator, non-saturating logistic loss.

class DCGANGenerator(nn.Module):
    def __init__(self, resolution: int = 64, z_dim: int = 100, width: int = 64, channels: int = 3):
        super().__init__()
        ups = {32: 3, 64: 4}[resolution]
        mult = 2 ** (ups - 1)
        layers = [nn.ConvTranspose2d(z_dim, width * mult, 4, 1, 0, bias=False),
                  nn.BatchNorm2d(width * mult), nn.ReLU(True)]
        for _ in range(ups - 1):
            layers += [nn.ConvTranspose2d(width * mult, width * mult // 2, 4, 2, 1, bias=False),
                       nn.BatchNorm2d(width * mult // 2), nn.ReLU(True)]
            mult //= 2
        layers += [nn.ConvTranspose2d(width, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


class DCGANDiscriminator(nn.Module):
    def __init__(self, resolution: int = 64, width: int = 64, channels: int = 3):
        super().__init__()
        downs = {32: 3, 64: 4}[resolution]
        layers = [nn.Conv2d(channels, width, 4, 2, 1), nn.LeakyReLU(0.2, True)]
        mult = 1
        for _ in range(downs - 1):
            layers += [nn.Conv2d(width * mult, width * mult * 2, 4, 2, 1), nn.LeakyReLU(0.2, True)]
            mult *= 2
        layers += [nn.Conv2d(width * mult, 1, 4, 1, 0)]
        self.main = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x).flatten(1)


class DCGAN(nn.Module):
    def __init__(self, resolution: int = 64, width: int = 64, z_dim: int = 100):
        super().__init__()
        self.generator = DCGANGenerator(resolution, z_dim, width)
        self.discriminator = DCGANDiscriminator(resolution, width)

    def phase_d(self, real: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        fake = self.generator(z).detach()
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()

    def phase_g(self, z: torch.Tensor) -> torch.Tensor:
        return F.softplus(-self.discriminator(self.generator(z))).mean()


def two_phase_spec(name, batch, data_shape, z_shape, lr=2e-4, betas=(0.5, 0.999), buffers="local"):
    adam = {"type": "adam", "lr": lr, "betas": list(betas), "eps": 1e-8, "weight_decay": 0.0}
    z = {"name": "z", "source": "normal", "shape": list(z_shape)}
    return {
        "ganc_spec": 1,
        "name": name,
        "batch_size": batch,
        "data": {"shape": list(data_shape)},
        "phases": [
            {"name": "d", "method": "phase_d", "updates": ["discriminator"], "interval": 1,
             "inputs": [{"name": "real", "source": "data"}, z]},
            {"name": "g", "method": "phase_g", "updates": ["generator"], "interval": 1,
             "inputs": [z]},
        ],
        "optimizers": {"discriminator": dict(adam), "generator": dict(adam)},
        "buffers": buffers,
        "sample": {"submodule": "generator", "noise_shape": list(z_shape)},
    }


def training_step_spec(name, batch, data_shape, z_shape, precision="bfloat16", accumulate_d=2,
                       clip_g=0.1, loss_scaling=True):
    """The two-phase spec with the training-step features of GPU recipes (ganc_spec 2):
    autocast of every forward to `precision`, D accumulating `accumulate_d` micro-batches per
    step, G's gradients clipped to a 2-norm of `clip_g` (None: no clipping), and one dynamic
    loss scaler (GradScaler's defaults) shared by both phases."""
    spec = two_phase_spec(name, batch, data_shape, z_shape)
    spec["ganc_spec"] = 2
    spec["precision"] = precision
    spec["phases"][0]["accumulate"] = accumulate_d
    if loss_scaling:
        spec["loss_scalers"] = {"amp": {}}
        for phase in spec["phases"]:
            phase["loss_scaler"] = "amp"
    if clip_g is not None:
        spec["optimizers"]["generator"]["clip_grad_norm"] = {"max_norm": clip_g, "norm_type": 2.0}
    return spec
