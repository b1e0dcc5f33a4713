"""StyleGAN3-T written the way NVIDIA's stylegan3 writes its alias-free generator, exported without
edits: Fourier-feature input with a learned rotation and translation (in-place item assignment
into transform matrices), modulated convolutions, `filtered_lrelu` on its reference path (bias,
upsampling by a separable windowed-sinc filter, leaky ReLU with gain and clamp, downsampling by
another, with negative padding taken as crops), an input magnitude EMA updated when a phase
passes `update_emas=True` as a keyword through `**layer_kwargs`, and a ToRGB layer. The
discriminator is StyleGAN2-ADA's (as NVIDIA's stylegan3 configurations use).

Nothing here scripts; `ganc.export` traces the networks once per distinct keyword value
(`update_emas` False in Gmain, True in Dmain) and scripts the phases, which are StyleGAN2Loss's
as train.py sets it for StyleGAN3: Gmain, Dmain, Dreg (R1 every 16 steps), no path length.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn

from .stylegan2_ada import (Discriminator, FullyConnectedLayer, MappingNetwork, assert_shape, bias_act,
                            persistent_class)


# ---------------------------------------------------------------------------------------------
# torch_utils/ops/upfirdn2d.py and filtered_lrelu.py (the reference paths)

def upfirdn2d(x, f, up=1, down=1, padding=(0, 0, 0, 0), gain=1):
    """Zero insertion, pad then crop (negative padding), a depthwise FIR convolution (a 1-D
    filter as two passes, a row then a column), and a strided slice."""
    if f is None:
        f = torch.ones([1, 1], dtype=torch.float32, device=x.device)
    batch_size, num_channels, in_height, in_width = x.shape
    px0, px1, py0, py1 = padding
    x = x.reshape([batch_size, num_channels, in_height, 1, in_width, 1])
    x = torch.nn.functional.pad(x, [0, up - 1, 0, 0, 0, up - 1])
    x = x.reshape([batch_size, num_channels, in_height * up, in_width * up])
    x = torch.nn.functional.pad(x, [max(px0, 0), max(px1, 0), max(py0, 0), max(py1, 0)])
    x = x[:, :, max(-py0, 0): x.shape[2] - max(-py1, 0), max(-px0, 0): x.shape[3] - max(-px1, 0)]
    f = f * (gain ** (f.ndim / 2))
    f = f.to(x.dtype)
    f = f.flip(list(range(f.ndim)))
    f = f[np.newaxis, np.newaxis].repeat([num_channels, 1] + [1] * f.ndim)
    if f.ndim == 4:
        x = torch.nn.functional.conv2d(input=x, weight=f, groups=num_channels)
    else:
        x = torch.nn.functional.conv2d(input=x, weight=f.unsqueeze(2), groups=num_channels)
        x = torch.nn.functional.conv2d(input=x, weight=f.unsqueeze(3), groups=num_channels)
    return x[:, :, ::down, ::down]


def filtered_lrelu(x, fu=None, fd=None, b=None, up=1, down=1, padding=(0, 0, 0, 0), gain=np.sqrt(2),
                   slope=0.2, clamp=None):
    x = bias_act(x, b)
    x = upfirdn2d(x, fu, up=up, padding=padding, gain=up ** 2)
    x = bias_act(x, act="lrelu", alpha=slope, gain=gain, clamp=clamp)
    return upfirdn2d(x, fd, down=down)


def lowpass_filter(numtaps, cutoff, width, fs):
    """A Kaiser-windowed sinc of `numtaps` taps, unit DC gain (None for a single tap)."""
    if numtaps == 1:
        return None
    atten = 2.285 * (numtaps - 1) * np.pi * (width / (fs / 2)) + 7.95
    beta = 0.1102 * (atten - 8.7) if atten > 50 else (0.5842 * (atten - 21) ** 0.4 + 0.07886 * (atten - 21)
                                                      if atten > 21 else 0.0)
    n = np.arange(numtaps) - (numtaps - 1) / 2
    f = np.sinc(2 * cutoff / fs * n) * np.kaiser(numtaps, beta)
    return torch.as_tensor(f / f.sum(), dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# training/networks_stylegan3.py

def modulated_conv2d(x, w, s, demodulate=True, padding=0, input_gain=None):
    batch_size = int(x.shape[0])
    out_channels, in_channels, kh, kw = w.shape
    assert_shape(s, [batch_size, in_channels])
    if demodulate:
        w = w * w.square().mean([1, 2, 3], keepdim=True).rsqrt()
        s = s * s.square().mean().rsqrt()
    w = w.unsqueeze(0) * s.unsqueeze(1).unsqueeze(3).unsqueeze(4)
    if demodulate:
        w = w * (w.square().sum(dim=[2, 3, 4]) + 1e-8).rsqrt().unsqueeze(2).unsqueeze(3).unsqueeze(4)
    if input_gain is not None:
        w = w * input_gain.expand(batch_size, in_channels).unsqueeze(1).unsqueeze(3).unsqueeze(4)
    x = x.reshape(1, -1, *x.shape[2:])
    w = w.reshape(-1, in_channels, kh, kw)
    x = torch.nn.functional.conv2d(input=x, weight=w.to(x.dtype), padding=padding, groups=batch_size)
    return x.reshape(batch_size, -1, *x.shape[2:])


@persistent_class
class SynthesisInput(nn.Module):
    def __init__(self, w_dim, channels, size, sampling_rate, bandwidth):
        super().__init__()
        self.channels = channels
        self.size = np.broadcast_to(np.asarray(size), [2])
        self.sampling_rate = sampling_rate
        self.bandwidth = bandwidth
        freqs = torch.randn([channels, 2])
        radii = freqs.square().sum(dim=1, keepdim=True).sqrt()
        freqs /= radii * radii.square().exp().pow(0.25)
        self.weight = nn.Parameter(torch.randn([channels, channels]))
        self.affine = FullyConnectedLayer(w_dim, 4, bias_init=0)
        with torch.no_grad():
            self.affine.weight.zero_()
            self.affine.bias.copy_(torch.tensor([1.0, 0, 0, 0]))
        self.register_buffer("transform", torch.eye(3, 3))
        self.register_buffer("freqs", freqs * bandwidth)
        self.register_buffer("phases", torch.rand([channels]) - 0.5)

    def forward(self, w):
        transforms = self.transform.unsqueeze(0)
        freqs = self.freqs.unsqueeze(0)
        phases = self.phases.unsqueeze(0)
        t = self.affine(w)
        t = t / t[:, :2].norm(dim=1, keepdim=True)
        m_r = torch.eye(3, device=w.device, dtype=w.dtype).unsqueeze(0).repeat([w.shape[0], 1, 1])
        m_r[:, 0, 0] = t[:, 0]
        m_r[:, 0, 1] = -t[:, 1]
        m_r[:, 1, 0] = t[:, 1]
        m_r[:, 1, 1] = t[:, 0]
        m_t = torch.eye(3, device=w.device, dtype=w.dtype).unsqueeze(0).repeat([w.shape[0], 1, 1])
        m_t[:, 0, 2] = -t[:, 2]
        m_t[:, 1, 2] = -t[:, 3]
        transforms = m_r @ m_t @ transforms
        phases = phases + (freqs @ transforms[:, :2, 2:]).squeeze(2)
        freqs = freqs @ transforms[:, :2, :2]
        amplitudes = (1 - (freqs.norm(dim=2) - self.bandwidth) / (self.sampling_rate / 2 - self.bandwidth)).clamp(0, 1)
        theta = torch.eye(2, 3, device=w.device, dtype=w.dtype)
        theta[0, 0] = 0.5 * self.size[0] / self.sampling_rate
        theta[1, 1] = 0.5 * self.size[1] / self.sampling_rate
        grids = torch.nn.functional.affine_grid(theta.unsqueeze(0), [1, 1, self.size[1], self.size[0]],
                                                align_corners=False)
        x = (grids.unsqueeze(3) @ freqs.permute(0, 2, 1).unsqueeze(1).unsqueeze(2)).squeeze(3)
        x = x + phases.unsqueeze(1).unsqueeze(2)
        x = torch.sin(x * (np.pi * 2))
        x = x * amplitudes.unsqueeze(1).unsqueeze(2)
        x = x @ (self.weight / np.sqrt(self.channels)).t()
        return x.permute(0, 3, 1, 2)


@persistent_class
class SynthesisLayer(nn.Module):
    def __init__(self, w_dim, is_torgb, in_channels, out_channels, in_size, out_size, in_sampling_rate,
                 out_sampling_rate, in_cutoff, out_cutoff, in_half_width, out_half_width, conv_kernel=3,
                 filter_size=6, lrelu_upsampling=2, conv_clamp=256, magnitude_ema_beta=0.999):
        super().__init__()
        self.is_torgb = is_torgb
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.in_size = np.broadcast_to(np.asarray(in_size), [2])
        self.out_size = np.broadcast_to(np.asarray(out_size), [2])
        tmp_sampling_rate = max(in_sampling_rate, out_sampling_rate) * (1 if is_torgb else lrelu_upsampling)
        self.conv_kernel = 1 if is_torgb else conv_kernel
        self.conv_clamp = conv_clamp
        self.magnitude_ema_beta = magnitude_ema_beta
        self.affine = FullyConnectedLayer(w_dim, in_channels, bias_init=1)
        self.weight = nn.Parameter(torch.randn([out_channels, in_channels, self.conv_kernel, self.conv_kernel]))
        self.bias = nn.Parameter(torch.zeros([out_channels]))
        self.register_buffer("magnitude_ema", torch.ones([]))
        self.up_factor = int(np.rint(tmp_sampling_rate / in_sampling_rate))
        self.up_taps = filter_size * self.up_factor if self.up_factor > 1 and not is_torgb else 1
        self.register_buffer("up_filter", lowpass_filter(self.up_taps, in_cutoff, in_half_width * 2,
                                                         tmp_sampling_rate))
        self.down_factor = int(np.rint(tmp_sampling_rate / out_sampling_rate))
        self.down_taps = filter_size * self.down_factor if self.down_factor > 1 and not is_torgb else 1
        self.register_buffer("down_filter", lowpass_filter(self.down_taps, out_cutoff, out_half_width * 2,
                                                           tmp_sampling_rate))
        pad_total = (self.out_size - 1) * self.down_factor + 1
        pad_total -= (self.in_size + self.conv_kernel - 1) * self.up_factor
        pad_total += self.up_taps + self.down_taps - 2
        pad_lo = (pad_total + self.up_factor) // 2
        pad_hi = pad_total - pad_lo
        self.padding = [int(pad_lo[0]), int(pad_hi[0]), int(pad_lo[1]), int(pad_hi[1])]

    def forward(self, x, w, noise_mode="random", update_emas=False):
        assert noise_mode in ["random", "const", "none"]
        assert_shape(x, [None, self.in_channels, int(self.in_size[1]), int(self.in_size[0])])
        if update_emas:
            magnitude_cur = x.detach().square().mean()
            self.magnitude_ema.copy_(magnitude_cur.lerp(self.magnitude_ema, self.magnitude_ema_beta))
        input_gain = self.magnitude_ema.rsqrt()
        styles = self.affine(w)
        if self.is_torgb:
            styles = styles * (1 / np.sqrt(self.in_channels * (self.conv_kernel ** 2)))
        x = modulated_conv2d(x, self.weight, styles, demodulate=not self.is_torgb, padding=self.conv_kernel - 1,
                             input_gain=input_gain)
        gain = 1 if self.is_torgb else np.sqrt(2)
        slope = 1 if self.is_torgb else 0.2
        x = filtered_lrelu(x, fu=self.up_filter, fd=self.down_filter, b=self.bias.to(x.dtype), up=self.up_factor,
                           down=self.down_factor, padding=self.padding, gain=gain, slope=slope,
                           clamp=self.conv_clamp)
        assert_shape(x, [None, self.out_channels, int(self.out_size[1]), int(self.out_size[0])])
        return x


@persistent_class
class SynthesisNetwork(nn.Module):
    def __init__(self, w_dim, img_resolution, img_channels, channel_base=256, channel_max=32, num_layers=4,
                 num_critical=2, first_cutoff=2, first_stopband=2 ** 2.1, last_stopband_rel=2 ** 0.3,
                 margin_size=2, output_scale=0.25, **layer_kwargs):
        super().__init__()
        self.w_dim = w_dim
        self.num_ws = num_layers + 2
        self.img_resolution = img_resolution
        self.output_scale = output_scale
        last_cutoff = img_resolution / 2
        exponents = np.minimum(np.arange(num_layers + 1) / (num_layers - num_critical), 1)
        cutoffs = first_cutoff * (last_cutoff / first_cutoff) ** exponents
        stopbands = first_stopband * (last_cutoff * last_stopband_rel / first_stopband) ** exponents
        sampling_rates = np.exp2(np.ceil(np.log2(np.minimum(stopbands * 2, img_resolution))))
        half_widths = np.maximum(stopbands, sampling_rates / 2) - cutoffs
        sizes = sampling_rates + margin_size * 2
        sizes[-2:] = img_resolution
        channels = np.rint(np.minimum((channel_base / 2) / cutoffs, channel_max))
        channels[-1] = img_channels
        self.input = SynthesisInput(w_dim, int(channels[0]), int(sizes[0]), sampling_rates[0], cutoffs[0])
        self.layer_names = []
        for idx in range(num_layers + 1):
            prev = max(idx - 1, 0)
            layer = SynthesisLayer(w_dim, idx == num_layers, int(channels[prev]), int(channels[idx]),
                                   int(sizes[prev]), int(sizes[idx]), int(sampling_rates[prev]),
                                   int(sampling_rates[idx]), cutoffs[prev], cutoffs[idx], half_widths[prev],
                                   half_widths[idx], **layer_kwargs)
            name = f"L{idx}_{layer.out_size[0]}_{layer.out_channels}"
            setattr(self, name, layer)
            self.layer_names.append(name)

    def forward(self, ws, **layer_kwargs):
        assert_shape(ws, [None, self.num_ws, self.w_dim])
        ws = ws.unbind(dim=1)
        x = self.input(ws[0])
        for name, w in zip(self.layer_names, ws[1:]):
            x = getattr(self, name)(x, w, **layer_kwargs)
        if self.output_scale != 1:
            x = x * self.output_scale
        assert_shape(x, [None, 3, self.img_resolution, self.img_resolution])
        return x


@persistent_class
class Generator(nn.Module):
    def __init__(self, z_dim, w_dim, img_resolution, mapping_kwargs={}, **synthesis_kwargs):
        super().__init__()
        self.synthesis = SynthesisNetwork(w_dim=w_dim, img_resolution=img_resolution, img_channels=3,
                                          **synthesis_kwargs)
        self.mapping = MappingNetwork(z_dim=z_dim, c_dim=0, w_dim=w_dim, num_ws=self.synthesis.num_ws,
                                      **mapping_kwargs)

    def forward(self, z, c=None, update_emas=False, **synthesis_kwargs):
        ws = self.mapping(z, c, update_emas=update_emas)
        return self.synthesis(ws, update_emas=update_emas, **synthesis_kwargs)


class StyleGAN3(nn.Module):
    """StyleGAN2Loss's phases as train.py runs them for `--cfg stylegan3-t`."""

    def __init__(self, z_dim=32, w_dim=32, resolution=16, r1_gamma=2.0, d_reg_interval=16):
        super().__init__()
        self.G = Generator(z_dim, w_dim, resolution, mapping_kwargs=dict(num_layers=2),
                           magnitude_ema_beta=0.5 ** (8 / 20e3))
        self.D = Discriminator(c_dim=0, img_resolution=resolution, img_channels=3, channel_base=512, channel_max=32)
        self.G_ema = copy.deepcopy(self.G).eval().requires_grad_(False)
        self.r1_gamma = r1_gamma
        self.d_reg_interval = d_reg_interval

    def run_G(self, z, update_emas=False):
        ws = self.G.mapping(z, None, update_emas=update_emas)
        return self.G.synthesis(ws, update_emas=update_emas)

    def phase_gmain(self, gen_z):
        return torch.nn.functional.softplus(-self.D(self.run_G(gen_z))).mean()

    def phase_dmain(self, real_img, gen_z):
        gen_img = self.run_G(gen_z, update_emas=True).detach()
        loss_gen = torch.nn.functional.softplus(self.D(gen_img)).mean()
        return loss_gen + torch.nn.functional.softplus(-self.D(real_img)).mean()

    def phase_dreg(self, real_img):
        real_img_tmp = real_img.detach().requires_grad_(True)
        r1_grads = torch.autograd.grad([self.D(real_img_tmp).sum()], [real_img_tmp], create_graph=True)[0]
        assert r1_grads is not None
        return (r1_grads.square().sum([1, 2, 3]) * (self.r1_gamma / 2)).mean() * self.d_reg_interval


def stylegan3_spec(name, batch=8, z_dim=32, resolution=16, d_reg=16):
    """train.py's optimizers for StyleGAN3: Adam(betas=(0, 0.99)), G at 0.0025 (no lazy
    regulariser), D's lr and betas scaled by 16/17 for R1 every 16 steps."""
    ratio = d_reg / (d_reg + 1)
    z = {"name": "gen_z", "source": "normal", "shape": [z_dim]}
    real = {"name": "real_img", "source": "data"}
    return {
        "ganc_spec": 1, "name": name, "batch_size": batch, "data": {"shape": [3, resolution, resolution]},
        "phases": [
            {"name": "Gmain", "method": "phase_gmain", "updates": ["G"], "inputs": [z]},
            {"name": "Dmain", "method": "phase_dmain", "updates": ["D"], "inputs": [real, z]},
            {"name": "Dreg", "method": "phase_dreg", "updates": ["D"], "interval": d_reg, "inputs": [real]},
        ],
        "optimizers": {"G": {"type": "adam", "lr": 0.0025, "betas": [0.0, 0.99]},
                       "D": {"type": "adam", "lr": 0.002 * ratio, "betas": [0.0, 0.99 ** ratio]}},
        "buffers": "local",
        "ema": {"submodule": "G", "copy": "G_ema", "half_life_images": 500},
    }
