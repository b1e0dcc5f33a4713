"""Lazy R1 regularisation as its own phase (StyleGAN2's rule)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .mlp import MLPGAN, mlp_spec


class R1GAN(MLPGAN):
    """Non-saturating GAN with lazy R1 regularisation (StyleGAN2): the penalty on D's
    gradient at real samples is its own phase, run every `interval` steps with its loss
    multiplied by the interval."""

    def __init__(self, gamma: float = 1.0, interval: int = 4):
        super().__init__()
        self.gamma = gamma
        self.interval = interval

    def phase_dreg(self, real):
        x = real.detach().requires_grad_(True)
        out = self.discriminator(x)
        grads = torch.autograd.grad([out.sum()], [x], create_graph=True)
        g = grads[0]
        assert g is not None
        return g.pow(2).sum(dim=1).mean() * (self.gamma / 2) * self.interval


def r1_spec(name, batch=64, interval=4, lr=1e-3, betas=(0.0, 0.99)):
    """StyleGAN2's lazy-regularisation rule for the regularised submodule's optimizer:
    lr and betas scaled by k/(k+1) for a penalty run every k steps."""
    ratio = interval / (interval + 1)
    spec = mlp_spec(name, batch)
    spec["phases"].insert(1, {"name": "dreg", "method": "phase_dreg", "updates": ["discriminator"],
                              "interval": interval, "inputs": [{"name": "real", "source": "data"}]})
    spec["optimizers"]["discriminator"] = {"type": "adam", "lr": lr * ratio,
                                           "betas": [betas[0] ** ratio, betas[1] ** ratio],
                                           "eps": 1e-8, "weight_decay": 0.0}
    spec["optimizers"]["generator"] = {"type": "adam", "lr": lr, "betas": list(betas), "eps": 1e-8,
                                       "weight_decay": 0.0}
    return spec
