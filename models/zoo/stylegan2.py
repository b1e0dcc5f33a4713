"""StyleGAN2: mapping network, modulated convolutions, lazy path length and R1, G_ema. Small by
default (the zoo's `stylegan2`); `stylegan2_256` is StyleGAN2-ADA's 256-pixel configuration."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# StyleGAN2-style (Karras et al. 2020): a mapping network z -> w, a synthesis network of
# modulated, demodulated convolutions from a learned 4x4 constant with skip to-RGB outputs, a
# residual discriminator with minibatch standard deviation; equalised learning rate in every
# layer of both networks. Four phases as in StyleGAN2:
# Gmain, Greg (path-length regularisation every 4 steps), Dmain, Dreg (R1 every 16 steps),
# each regulariser's loss multiplied by its interval; G_ema averaged after every step. The
# channels at each resolution are `channels` (the small default: 32 everywhere) or, given a
# `channel_base`, min(channel_base / resolution, channel_max) as in StyleGAN2 (16384 and 512 in
# StyleGAN2-ADA's "paper256" configuration).


def channels_at(resolution: int, channels: int, channel_base: int, channel_max: int) -> int:
    return min(channel_base // resolution, channel_max) if channel_base else channels

class EqualLinear(nn.Module):
    """Linear layer with equalised learning rate (weights scaled at run time)."""

    def __init__(self, in_features: int, out_features: int, bias_init: float = 0.0,
                 lr_multiplier: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / lr_multiplier)
        self.bias = nn.Parameter(torch.full([out_features], float(bias_init)))
        self.weight_gain = lr_multiplier / math.sqrt(in_features)
        self.bias_gain = lr_multiplier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight * self.weight_gain, self.bias * self.bias_gain)


class EqualConv2d(nn.Module):
    """Convolution with equalised learning rate, as every layer of StyleGAN2's discriminator:
    N(0, 1) weights scaled by 1/sqrt(fan-in) at run time, so Adam's step is the same relative
    size in every layer. (With PyTorch's default initialisation instead, StyleGAN2's learning
    rate makes the full-size discriminator's outputs explode within a few steps, in eager
    PyTorch as in ganc.)"""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel, kernel))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.weight_gain = 1.0 / math.sqrt(in_channels * kernel * kernel)
        self.padding = kernel // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight * self.weight_gain, self.bias, padding=self.padding)


class MappingNetwork(nn.Module):
    def __init__(self, z_dim: int = 32, w_dim: int = 32, layers: int = 4):
        super().__init__()
        self.layers = nn.ModuleList([EqualLinear(z_dim if i == 0 else w_dim, w_dim, lr_multiplier=0.01)
                                     for i in range(layers)])

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = z * (z.square().mean(dim=1, keepdim=True) + 1e-8).rsqrt()  # pixel norm
        for layer in self.layers:
            x = F.leaky_relu(layer(x), 0.2) * math.sqrt(2.0)
        return x


def _upsample_last(x: torch.Tensor) -> torch.Tensor:
    """Doubles the last dimension: even outputs 3/4 x[i] + 1/4 x[i-1], odd ones 3/4 x[i] +
    1/4 x[i+1], zero beyond the edges."""
    padded = F.pad(x, [1, 1])
    even = 0.25 * padded[..., :-2] + 0.75 * x
    odd = 0.75 * x + 0.25 * padded[..., 2:]
    return torch.stack([even, odd], dim=-1).flatten(-2)


def upsample2d(x: torch.Tensor) -> torch.Tensor:
    """StyleGAN2's 2x upsampling: upfirdn2d with the [1, 3, 3, 1] filter and zero padding,
    written with pads and slices. Its backward has no atomics, so training is reproducible
    on GPUs (the backward of F.interpolate's bilinear mode is not deterministic on CUDA)."""
    return _upsample_last(_upsample_last(x).transpose(2, 3)).transpose(2, 3)


class ModulatedConv2d(nn.Module):
    """Per-sample weights: the kernel scaled by a style from w, then demodulated to unit
    norm per output channel; run as one grouped convolution over the batch."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, w_dim: int,
                 demodulate: bool = True, up: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel, kernel))
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.affine = EqualLinear(w_dim, in_channels, bias_init=1.0)
        self.weight_gain = 1.0 / math.sqrt(in_channels * kernel * kernel)
        self.demodulate = demodulate
        self.up = up
        self.kernel = kernel

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        batch, channels = x.shape[0], x.shape[1]
        styles = self.affine(w)
        weight = self.weight.unsqueeze(0) * self.weight_gain * styles.view(batch, 1, -1, 1, 1)
        if self.demodulate:
            weight = weight * (weight.square().sum(dim=[2, 3, 4]) + 1e-8).rsqrt().view(batch, -1, 1, 1, 1)
        if self.up:
            x = upsample2d(x)
        x = x.reshape(1, batch * channels, x.shape[2], x.shape[3])
        out = F.conv2d(x, weight.reshape(-1, channels, self.kernel, self.kernel),
                       padding=self.kernel // 2, groups=batch)
        return out.view(batch, -1, out.shape[2], out.shape[3]) + self.bias.view(1, -1, 1, 1)


class SynthesisBlock(nn.Module):
    """Doubles the resolution: two modulated convolutions and a to-RGB added to the upsampled
    image so far. Consumes three w's."""

    def __init__(self, in_channels: int, out_channels: int, w_dim: int):
        super().__init__()
        self.conv0 = ModulatedConv2d(in_channels, out_channels, 3, w_dim, up=True)
        self.conv1 = ModulatedConv2d(out_channels, out_channels, 3, w_dim)
        self.to_rgb = ModulatedConv2d(out_channels, 3, 1, w_dim, demodulate=False)

    def forward(self, x: torch.Tensor, img: torch.Tensor, ws: torch.Tensor):
        x = F.leaky_relu(self.conv0(x, ws[:, 0]), 0.2) * math.sqrt(2.0)
        x = F.leaky_relu(self.conv1(x, ws[:, 1]), 0.2) * math.sqrt(2.0)
        img = upsample2d(img)
        return x, img + self.to_rgb(x, ws[:, 2])


class SynthesisNetwork(nn.Module):
    def __init__(self, w_dim: int = 32, channels: int = 32, resolution: int = 32,
                 channel_base: int = 0, channel_max: int = 512):
        super().__init__()
        ch = [channels_at(4 << i, channels, channel_base, channel_max)
              for i in range(int(math.log2(resolution)) - 1)]  # at 4, 8, ..., resolution
        self.const = nn.Parameter(torch.randn(1, ch[0], 4, 4))
        self.conv = ModulatedConv2d(ch[0], ch[0], 3, w_dim)
        self.to_rgb = ModulatedConv2d(ch[0], 3, 1, w_dim, demodulate=False)
        ups = len(ch) - 1
        self.blocks = nn.ModuleList([SynthesisBlock(ch[i], ch[i + 1], w_dim) for i in range(ups)])
        self.num_ws = 2 + 3 * ups

    def forward(self, ws: torch.Tensor) -> torch.Tensor:
        x = self.const.expand(ws.shape[0], -1, -1, -1)
        x = F.leaky_relu(self.conv(x, ws[:, 0]), 0.2) * math.sqrt(2.0)
        img = self.to_rgb(x, ws[:, 1])
        for i, block in enumerate(self.blocks):
            x, img = block(x, img, ws.narrow(1, 2 + 3 * i, 3))
        return img


class StyleGenerator(nn.Module):
    def __init__(self, z_dim: int = 32, w_dim: int = 32, resolution: int = 32, channels: int = 32,
                 channel_base: int = 0, mapping_layers: int = 4):
        super().__init__()
        self.mapping = MappingNetwork(z_dim, w_dim, mapping_layers)
        self.synthesis = SynthesisNetwork(w_dim, channels, resolution, channel_base)

    def ws(self, z: torch.Tensor) -> torch.Tensor:
        """One w per synthesis layer (no style mixing): [batch, num_ws, w_dim]."""
        return self.mapping(z).unsqueeze(1).repeat(1, self.synthesis.num_ws, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.synthesis(self.ws(z))


class ResidualDownBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv0 = EqualConv2d(in_channels, in_channels, 3)
        self.conv1 = EqualConv2d(in_channels, out_channels, 3)
        self.skip = EqualConv2d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.skip(F.avg_pool2d(x, 2))
        x = F.leaky_relu(self.conv0(x), 0.2) * math.sqrt(2.0)
        x = F.avg_pool2d(F.leaky_relu(self.conv1(x), 0.2) * math.sqrt(2.0), 2)
        return (x + y) / math.sqrt(2.0)


class StyleDiscriminator(nn.Module):
    def __init__(self, channels: int = 32, resolution: int = 32, mbstd_group: int = 4,
                 channel_base: int = 0, channel_max: int = 512):
        super().__init__()
        ch = [channels_at(resolution >> i, channels, channel_base, channel_max)
              for i in range(int(math.log2(resolution)) - 1)]  # at resolution, ..., 8, 4
        self.from_rgb = EqualConv2d(3, ch[0], 1)
        self.blocks = nn.ModuleList([ResidualDownBlock(ch[i], ch[i + 1]) for i in range(len(ch) - 1)])
        self.mbstd_group = mbstd_group
        self.conv = EqualConv2d(ch[-1] + 1, ch[-1], 3)
        self.fc = EqualLinear(ch[-1] * 16, ch[-1])
        self.out = EqualLinear(ch[-1], 1)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = F.leaky_relu(self.from_rgb(img), 0.2) * math.sqrt(2.0)
        for block in self.blocks:
            x = block(x)
        # Minibatch standard deviation over groups of samples, as one extra feature map.
        n, c, h, w = x.shape
        g = min(self.mbstd_group, n)
        y = x.reshape(g, -1, c, h, w)
        y = (y - y.mean(dim=0)).square().mean(dim=0).add(1e-8).sqrt().mean(dim=[1, 2, 3])
        y = y.reshape(-1, 1, 1, 1).repeat(g, 1, h, w)
        x = F.leaky_relu(self.conv(torch.cat([x, y], dim=1)), 0.2) * math.sqrt(2.0)
        return self.out(F.leaky_relu(self.fc(x.flatten(1)), 0.2) * math.sqrt(2.0))


class StyleGAN2(nn.Module):
    def __init__(self, g_reg_interval: int = 4, d_reg_interval: int = 16, r1_gamma: float = 1.0,
                 pl_weight: float = 2.0, pl_decay: float = 0.01, pl_batch_shrink: int = 2,
                 z_dim: int = 32, resolution: int = 32, channels: int = 32, channel_base: int = 0,
                 mapping_layers: int = 4):
        super().__init__()
        def generator():
            return StyleGenerator(z_dim, z_dim, resolution, channels, channel_base, mapping_layers)
        self.generator = generator()
        self.discriminator = StyleDiscriminator(channels, resolution, channel_base=channel_base)
        self.generator_ema = generator()
        self.generator_ema.load_state_dict(self.generator.state_dict())
        self.generator_ema.requires_grad_(False)
        self.register_buffer("pl_mean", torch.zeros([]))
        self.g_reg_interval = g_reg_interval
        self.d_reg_interval = d_reg_interval
        self.r1_gamma = r1_gamma
        self.pl_weight = pl_weight
        self.pl_decay = pl_decay
        self.pl_batch_shrink = pl_batch_shrink

    def phase_gmain(self, z: torch.Tensor) -> torch.Tensor:
        return F.softplus(-self.discriminator(self.generator(z))).mean()

    def phase_greg(self, z: torch.Tensor, pl_noise: torch.Tensor) -> torch.Tensor:
        """Path-length regularisation: |J_w^T y| for random images y should stay constant."""
        batch = z.shape[0] // self.pl_batch_shrink
        ws = self.generator.ws(z[:batch])
        img = self.generator.synthesis(ws)
        noise = pl_noise[:batch] / math.sqrt(img.shape[2] * img.shape[3])
        grads = torch.autograd.grad([(img * noise).sum()], [ws], create_graph=True)[0]
        assert grads is not None
        lengths = grads.square().sum(dim=2).mean(dim=1).sqrt()
        # The running mean stays in the buffer's precision: under autocast the lengths are
        # bfloat16 or float16, and lerp takes no mixed dtypes.
        pl_mean = self.pl_mean.lerp(lengths.mean().detach().to(self.pl_mean.dtype), self.pl_decay)
        self.pl_mean.copy_(pl_mean)
        penalty = (lengths - pl_mean).square().mean()
        return penalty * self.pl_weight * self.g_reg_interval

    def phase_dmain(self, real: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        fake = self.generator(z).detach()
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()

    def phase_dreg(self, real: torch.Tensor) -> torch.Tensor:
        """R1: the squared gradient norm of D at real images."""
        x = real.detach().requires_grad_(True)
        grads = torch.autograd.grad([self.discriminator(x).sum()], [x], create_graph=True)[0]
        assert grads is not None
        return grads.square().sum(dim=[1, 2, 3]).mean() * (self.r1_gamma / 2) * self.d_reg_interval


def stylegan2_spec(name, batch=16, lr=0.002, betas=(0.0, 0.99), g_reg=4, d_reg=16, ema_images=500,
                   z_dim=32, resolution=32):
    """StyleGAN2's lazy-regularisation rule: a submodule regularised every k steps gets lr and
    betas scaled by k/(k+1)."""
    def adam(k):
        ratio = k / (k + 1)
        return {"type": "adam", "lr": lr * ratio, "betas": [b ** ratio for b in betas], "eps": 1e-8,
                "weight_decay": 0.0}

    z = {"name": "z", "source": "normal", "shape": [z_dim]}
    real = {"name": "real", "source": "data"}
    return {
        "ganc_spec": 1, "name": name, "batch_size": batch, "data": {"shape": [3, resolution, resolution]},
        "phases": [
            {"name": "Gmain", "method": "phase_gmain", "updates": ["generator"], "inputs": [z]},
            {"name": "Greg", "method": "phase_greg", "updates": ["generator"], "interval": g_reg,
             "inputs": [z, {"name": "pl_noise", "source": "normal", "shape": [3, resolution, resolution]}]},
            {"name": "Dmain", "method": "phase_dmain", "updates": ["discriminator"], "inputs": [real, z]},
            {"name": "Dreg", "method": "phase_dreg", "updates": ["discriminator"], "interval": d_reg,
             "inputs": [real]},
        ],
        "optimizers": {"generator": adam(g_reg), "discriminator": adam(d_reg)},
        "buffers": "local",
        "ema": {"submodule": "generator", "copy": "generator_ema", "half_life_images": ema_images},
        "sample": {"submodule": "generator_ema", "noise_shape": [z_dim]},
    }
