"""Progressive growing (PGGAN) from 8x8 to 32x32 with fade-ins."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# Progressive growing (Karras et al., PGGAN): the generator and discriminator grow from 8x8 to
# 32x32. `stage` selects how many blocks run; while a stage fades in, the new block's output
# is blended with the upsampled output of the previous stage by `alpha`. Eager DDP must run
# such a model with find_unused_parameters=True; ganc compiles one plan per stage.

class PGGenerator(nn.Module):
    def __init__(self, z_dim: int = 32, width: int = 32, stages: int = 3, base: int = 8):
        super().__init__()
        self.stage = 0
        self.base_size = base
        self.width = width
        self.resolution = base * 2 ** (stages - 1)
        self.input = nn.Linear(z_dim, width * base * base)
        self.blocks = nn.ModuleList([nn.Conv2d(width, width, 3, 1, 1) for _ in range(stages - 1)])
        self.to_rgb = nn.ModuleList([nn.Conv2d(width, 3, 1) for _ in range(stages)])

    def synthesize(self, z: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """Images at the current stage's resolution."""
        x = F.leaky_relu(self.input(z).view(-1, self.width, self.base_size, self.base_size), 0.2)
        previous = x
        for i, block in enumerate(self.blocks):
            if i < self.stage:
                previous = x
                x = F.leaky_relu(block(F.interpolate(x, scale_factor=2.0, mode="nearest")), 0.2)
        out = x
        for i, to_rgb in enumerate(self.to_rgb):
            if i == self.stage:
                out = to_rgb(x)
        for i, old_rgb in enumerate(self.to_rgb):
            if i == self.stage - 1:
                old = F.interpolate(old_rgb(previous), scale_factor=2.0, mode="nearest")
                out = alpha * out + (1 - alpha) * old
        return torch.tanh(out)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Samples at full resolution (the current stage's, upsampled), faded in completely."""
        img = self.synthesize(z, torch.ones((), dtype=z.dtype, device=z.device))
        return F.interpolate(img, size=[self.resolution, self.resolution], mode="nearest")


class PGDiscriminator(nn.Module):
    def __init__(self, width: int = 32, stages: int = 3, base: int = 8):
        super().__init__()
        self.stage = 0
        self.num_stages = stages
        self.from_rgb = nn.ModuleList([nn.Conv2d(3, width, 1) for _ in range(stages)])
        # blocks[i] halves the resolution of stage (stages - 1 - i): the first runs first.
        self.blocks = nn.ModuleList([nn.Conv2d(width, width, 3, 1, 1) for _ in range(stages - 1)])
        self.head = nn.Linear(width * base * base, 1)

    def forward(self, img: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        h = img
        for i, from_rgb in enumerate(self.from_rgb):
            if i == self.stage:
                h = F.leaky_relu(from_rgb(img), 0.2)
        first = self.num_stages - 1 - self.stage
        for i, block in enumerate(self.blocks):
            if i >= first:
                h = F.avg_pool2d(F.leaky_relu(block(h), 0.2), 2)
                if i == first:
                    for j, old_rgb in enumerate(self.from_rgb):
                        if j == self.stage - 1:
                            old = F.leaky_relu(old_rgb(F.avg_pool2d(img, 2)), 0.2)
                            h = alpha * h + (1 - alpha) * old
        return self.head(h.flatten(1))


class ProgressiveGAN(nn.Module):
    def __init__(self, stages: int = 3):
        super().__init__()
        self.generator = PGGenerator(stages=stages)
        self.discriminator = PGDiscriminator(stages=stages)
        self.num_stages = stages

    def real_at_stage(self, real: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """Real images at the current resolution, faded in like the generator's output."""
        x = real
        for _ in range(self.num_stages - 1 - self.discriminator.stage):
            x = F.avg_pool2d(x, 2)
        if self.discriminator.stage > 0:
            low = F.interpolate(F.avg_pool2d(x, 2), scale_factor=2.0, mode="nearest")
            x = alpha * x + (1 - alpha) * low
        return x

    def phase_d(self, real: torch.Tensor, z: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        fake = self.generator.synthesize(z, alpha).detach()
        return (F.softplus(self.discriminator(fake, alpha)).mean()
                + F.softplus(-self.discriminator(self.real_at_stage(real, alpha), alpha)).mean())

    def phase_g(self, z: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        return F.softplus(-self.discriminator(self.generator.synthesize(z, alpha), alpha)).mean()


def progressive_spec(name, batch=16, stage_steps=400, fade_steps=200):
    z = {"name": "z", "source": "normal", "shape": [32]}
    alpha = {"name": "alpha", "source": "fade"}
    return {
        "ganc_spec": 1, "name": name, "batch_size": batch, "data": {"shape": [3, 32, 32]},
        "phases": [
            {"name": "d", "method": "phase_d", "updates": ["discriminator"],
             "inputs": [{"name": "real", "source": "data"}, z, alpha]},
            {"name": "g", "method": "phase_g", "updates": ["generator"], "inputs": [z, alpha]},
        ],
        "optimizers": {s: {"type": "adam", "lr": 1e-3, "betas": [0.0, 0.99], "eps": 1e-8,
                           "weight_decay": 0.0} for s in ("generator", "discriminator")},
        "stages": {
            "attributes": ["generator.stage", "discriminator.stage"],
            "list": [
                {"name": "8x8", "steps": stage_steps},
                {"name": "16x16", "steps": stage_steps, "fade_steps": fade_steps,
                 "grows": ["generator.blocks.0", "generator.to_rgb.1",
                           "discriminator.from_rgb.1", "discriminator.blocks.1"]},
                {"name": "32x32", "fade_steps": fade_steps,
                 "grows": ["generator.blocks.1", "generator.to_rgb.2",
                           "discriminator.from_rgb.2", "discriminator.blocks.0"]},
            ],
        },
        "sample": {"submodule": "generator", "noise_shape": [32]},
    }
