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



