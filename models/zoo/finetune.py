"""Training part of a network: FreezeD-style fine-tuning, per-group learning rates, and a
parameter that sits on the GAN module itself."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .dcgan import two_phase_spec
from .mlp import MLPGAN, mlp_spec


def freezed_spec(name: str) -> dict:
    """DCGAN-32 fine-tuned the FreezeD way (Mo et al. 2020): the discriminator's two lower
    convolutions stay frozen, only its upper layers train; the generator's first block trains
    at a tenth of the learning rate (its own optimizer group, as people give a mapping network
    a lower rate), the rest of it in the default group its `updates` path gets."""
    spec = two_phase_spec(name, 32, [3, 32, 32], [100, 1, 1])
    spec["ganc_spec"] = 2
    spec["phases"][0]["updates"] = ["discriminator.main.4", "discriminator.main.6"]
    spec["optimizers"] = {
        "discriminator": spec["optimizers"]["discriminator"],
        "g_first_block": dict(spec["optimizers"]["generator"], lr=2e-5,
                              params=["generator.main.0", "generator.main.1"]),
    }
    return spec


class TemperatureGAN(MLPGAN):
    """The MLP GAN with a learnable logit scale owned by the GAN module itself (not by a
    submodule), trained with the discriminator."""

    def __init__(self):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(1.0))

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        scale = self.logit_scale
        return F.softplus(scale * self.discriminator(fake)).mean() + \
            F.softplus(-scale * self.discriminator(real)).mean()

    def phase_g(self, z):
        return F.softplus(-self.logit_scale * self.discriminator(self.generator(z))).mean()


def temperature_spec(name: str) -> dict:
    spec = mlp_spec(name)
    spec["ganc_spec"] = 2
    spec["phases"][0]["updates"] = ["discriminator", "logit_scale"]
    spec["optimizers"]["logit_scale"] = {"type": "sgd", "lr": 0.01, "momentum": 0.9}
    return spec





class BranchDiscriminator(nn.Module):
    """Two heads, one taken per call by the batch's mean (above 0.05 or not): a branch on data."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden))
        self.head_a = nn.Linear(hidden, 1)
        self.head_b = nn.Linear(hidden, 1)

    def forward(self, x):
        h = F.leaky_relu(self.body(x), 0.2)
        if bool(x.mean() > 0.05):
            return self.head_a(h)
        return self.head_b(h)


class BranchGAN(MLPGAN):
    """The MLP GAN whose discriminator head is chosen by the data: ranks and steps go different
    ways, and on some steps no rank reaches one of the heads."""

    def __init__(self):
        super().__init__()
        self.discriminator = BranchDiscriminator()
