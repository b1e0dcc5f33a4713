"""WGAN-GP: a gradient penalty by double backward, several critic steps per generator step."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .mlp import MLPGAN


class WGANGP(MLPGAN):
    """WGAN-GP (Gulrajani et al.): Wasserstein critic with a gradient penalty computed by
    double backward, several critic steps per generator step (the G phase's interval)."""

    def __init__(self, penalty: float = 10.0):
        super().__init__()
        self.penalty = penalty

    def phase_d(self, real, z, alpha):
        fake = self.generator(z).detach()
        interp = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        out = self.discriminator(interp)
        grads = torch.autograd.grad([out.sum()], [interp], create_graph=True)
        g = grads[0]
        assert g is not None
        gp = ((g.norm(2, dim=1) - 1) ** 2).mean()
        return self.discriminator(fake).mean() - self.discriminator(real).mean() + self.penalty * gp

    def phase_g(self, z):
        return -self.discriminator(self.generator(z)).mean()


def wgan_gp_spec(name, batch=64, n_critic=5):
    z = {"name": "z", "source": "normal", "shape": [8]}
    adam = {"type": "adam", "lr": 1e-4, "betas": [0.0, 0.9], "eps": 1e-8, "weight_decay": 0.0}
    return {
        "ganc_spec": 1, "name": name, "batch_size": batch, "data": {"shape": [2]},
        "phases": [
            {"name": "d", "method": "phase_d", "updates": ["discriminator"], "interval": 1,
             "inputs": [{"name": "real", "source": "data"}, z,
                        {"name": "alpha", "source": "uniform", "shape": [1]}]},
            {"name": "g", "method": "phase_g", "updates": ["generator"], "interval": n_critic,
             "inputs": [z]},
        ],
        "optimizers": {"discriminator": dict(adam), "generator": dict(adam)},
        "sample": {"submodule": "generator", "noise_shape": [8]},
    }
