"""CycleGAN-style on 2-D points: two generators and two discriminators."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .mlp import mlp


class CycleGAN(nn.Module):
    """CycleGAN-style (Zhu et al.) on 2-D points: two generators (A->B, B->A) and two
    discriminators; the G phase trains both generators at once with adversarial (least
    squares), cycle and identity losses. A data sample holds one point of each domain
    (row 0: domain A, row 1: domain B), drawn independently (unpaired)."""

    def __init__(self, hidden=32, cycle: float = 10.0, identity: float = 5.0):
        super().__init__()
        self.gen_ab = mlp([2, hidden, hidden, 2], nn.ReLU)
        self.gen_ba = mlp([2, hidden, hidden, 2], nn.ReLU)
        self.disc_a = mlp([2, hidden, 1], lambda: nn.LeakyReLU(0.2))
        self.disc_b = mlp([2, hidden, 1], lambda: nn.LeakyReLU(0.2))
        self.cycle = cycle
        self.identity = identity

    def phase_g(self, real):
        a, b = real[:, 0], real[:, 1]
        fake_b, fake_a = self.gen_ab(a), self.gen_ba(b)
        adv = ((self.disc_b(fake_b) - 1) ** 2).mean() + ((self.disc_a(fake_a) - 1) ** 2).mean()
        cyc = (self.gen_ba(fake_b) - a).abs().mean() + (self.gen_ab(fake_a) - b).abs().mean()
        idt = (self.gen_ab(b) - b).abs().mean() + (self.gen_ba(a) - a).abs().mean()
        return adv + self.cycle * cyc + self.identity * idt

    def phase_d(self, real):
        a, b = real[:, 0], real[:, 1]
        with torch.no_grad():
            fake_b, fake_a = self.gen_ab(a), self.gen_ba(b)
        loss_a = ((self.disc_a(a) - 1) ** 2).mean() + (self.disc_a(fake_a) ** 2).mean()
        loss_b = ((self.disc_b(b) - 1) ** 2).mean() + (self.disc_b(fake_b) ** 2).mean()
        return 0.5 * (loss_a + loss_b)


def cyclegan_spec(name, batch=64):
    adam = {"type": "adam", "lr": 2e-4, "betas": [0.5, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    return {
        "ganc_spec": 1, "name": name, "batch_size": batch, "data": {"shape": [2, 2]},
        "phases": [
            {"name": "g", "method": "phase_g", "updates": ["gen_ab", "gen_ba"], "interval": 1,
             "inputs": [{"name": "real", "source": "data"}]},
            {"name": "d", "method": "phase_d", "updates": ["disc_a", "disc_b"], "interval": 1,
             "inputs": [{"name": "real", "source": "data"}]},
        ],
        "optimizers": {k: dict(adam) for k in ("gen_ab", "gen_ba", "disc_a", "disc_b")},
    }
