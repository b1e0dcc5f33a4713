"""An exponential moving average of the generator, used for sampling."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .mlp import MLPGAN, MLPGenerator, mlp_spec


class EMAGAN(MLPGAN):
    """The MLP GAN with an exponential moving average of the generator (StyleGAN2's G_ema),
    used for sampling."""

    def __init__(self):
        super().__init__()
        self.generator_ema = MLPGenerator()
        self.generator_ema.load_state_dict(self.generator.state_dict())
        self.generator_ema.requires_grad_(False)


def ema_spec(name, batch=64, half_life_images=2000):
    spec = mlp_spec(name, batch)
    spec["ema"] = {"submodule": "generator", "copy": "generator_ema", "half_life_images": half_life_images}
    spec["sample"] = {"submodule": "generator_ema", "noise_shape": [8]}
    return spec
