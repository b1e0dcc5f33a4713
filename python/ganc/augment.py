"""StyleGAN2-ADA's augmentation pipeline (Karras et al., "Training Generative Adversarial Networks
with Limited Data", NeurIPS 2020, appendix B) as a module ganc's phases call: every pipe of
train.py's `--augpipe` (blit, geom, color, filter, noise, cutout and their sums `bgc`, ...),
each transformation applied per image with probability `p` times its multiplier, all of it
differentiable (G's step and R1 learn through it).

    pipe = ganc.augment.AugmentPipe(**ganc.augment.PIPES["bgc"])
    out = pipe(images, p)            # p: a 0-dim tensor (ADA's controller), else pipe.p

It takes NVIDIA's constructor arguments and holds their buffers (`p`, `Hz_geom`, `Hz_fbank`)
under their names, and draws its random numbers in the same order, so `from_nvidia(their_pipe)`
augments as theirs does with the same torch seed. What differs is only where their code
decides shapes from random draws: their geometric pipe pads each batch by the margin its
transforms need (at most the image's size less one pixel), which a trace would freeze and a
CUDA graph cannot replay; this one always pads by that bound, so every shape is static. The
pixels it samples are the same; the padded region is larger (about 9 times the image before
the 2x upsampling). Bilinear sampling is written out with gathers, so every derivative order
exists (R1 through the augmentation needs the second). The module scripts (TorchScript): it
needs no trace.

The wavelets are PyWavelets' (`sym6` for the geometric low-pass, `sym2` for the filter bank)."""
from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["AugmentPipe", "PIPES", "from_nvidia", "is_nvidias"]

_BLIT = {"xflip": 1, "rotate90": 1, "xint": 1}
_GEOM = {"scale": 1, "rotate": 1, "aniso": 1, "xfrac": 1}
_COLOR = {"brightness": 1, "contrast": 1, "lumaflip": 1, "hue": 1, "saturation": 1}
# train.py's --augpipe choices.
PIPES = {
    "blit": _BLIT, "geom": _GEOM, "color": _COLOR, "filter": {"imgfilter": 1}, "noise": {"noise": 1},
    "cutout": {"cutout": 1}, "bg": {**_BLIT, **_GEOM}, "bgc": {**_BLIT, **_GEOM, **_COLOR},
    "bgcf": {**_BLIT, **_GEOM, **_COLOR, "imgfilter": 1},
    "bgcfn": {**_BLIT, **_GEOM, **_COLOR, "imgfilter": 1, "noise": 1},
    "bgcfnc": {**_BLIT, **_GEOM, **_COLOR, "imgfilter": 1, "noise": 1, "cutout": 1},
}

_SETTINGS = ("xflip", "rotate90", "xint", "xint_max", "scale", "rotate", "aniso", "xfrac", "scale_std",
             "rotate_max", "aniso_std", "xfrac_std", "brightness", "contrast", "lumaflip", "hue", "saturation",
             "brightness_std", "contrast_std", "hue_max", "saturation_std", "imgfilter", "imgfilter_bands",
             "imgfilter_std", "noise", "cutout", "noise_std", "cutout_size")


def _wavelet(name: str) -> np.ndarray:
    import pywt  # PyWavelets: the decomposition low-pass filter
    return np.asarray(pywt.Wavelet(name).dec_lo, dtype=np.float64)


def _filter_bank(lo: np.ndarray) -> np.ndarray:
    """Four bands of a dyadic filter bank on the wavelet's low-pass H(z): band 0 the lowest,
    each finer band the previous ones' filters upsampled by two and smoothed by H(z)H(1/z)/2,
    plus the high-pass H(-z)H(-1/z)/2 in its own row."""
    hi = lo * (-1.0) ** np.arange(lo.size)
    lo2, hi2 = np.convolve(lo, lo[::-1]) / 2, np.convolve(hi, hi[::-1]) / 2
    bank = np.eye(4, 1)
    for band in range(1, 4):
        up = np.zeros((4, bank.shape[1] * 2 - 1))
        up[:, ::2] = bank
        bank = np.stack([np.convolve(row, lo2) for row in up])
        start = (bank.shape[1] - hi2.size) // 2
        bank[band, start:start + hi2.size] += hi2
    return bank


def _stack(rows: List[List[torch.Tensor]]) -> torch.Tensor:
    """A batch of matrices [n, rows, columns] from rows of [n] tensors."""
    return torch.stack([torch.stack(row, dim=-1) for row in rows], dim=-2)


def _translate2d(tx: torch.Tensor, ty: torch.Tensor) -> torch.Tensor:
    o, z = torch.ones_like(tx), torch.zeros_like(tx)
    return _stack([[o, z, tx], [z, o, ty], [z, z, o]])


def _scale2d(sx: torch.Tensor, sy: torch.Tensor) -> torch.Tensor:
    o, z = torch.ones_like(sx), torch.zeros_like(sx)
    return _stack([[sx, z, z], [z, sy, z], [z, z, o]])


def _rotate2d(theta: torch.Tensor) -> torch.Tensor:
    o, z, c, s = torch.ones_like(theta), torch.zeros_like(theta), torch.cos(theta), torch.sin(theta)
    return _stack([[c, -s, z], [s, c, z], [z, z, o]])


def _affine3d(m: List[List[torch.Tensor]], t: List[torch.Tensor]) -> torch.Tensor:
    """The 4x4 homogeneous matrix of the 3x3 `m` and the translation `t` (each entry [n])."""
    o, z = torch.ones_like(t[0]), torch.zeros_like(t[0])
    return _stack([m[0] + [t[0]], m[1] + [t[1]], m[2] + [t[2]], [z, z, z, o]])


def _rotate3d(v: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotation by `theta` about the unit axis v (Rodrigues' formula)."""
    x, y, w = v[0].expand_as(theta), v[1].expand_as(theta), v[2].expand_as(theta)
    s, c = torch.sin(theta), torch.cos(theta)
    k = 1 - c
    return _affine3d([[x * x * k + c, x * y * k - w * s, x * w * k + y * s],
                      [y * x * k + w * s, y * y * k + c, y * w * k - x * s],
                      [w * x * k - y * s, w * y * k + x * s, w * w * k + c]], [k * 0, k * 0, k * 0])


def _fir(x: torch.Tensor, f: torch.Tensor, up: int, down: int, pad: List[int], gain: float,
         flip: bool) -> torch.Tensor:
    """upfirdn2d's reference composition with a separable filter `f` (1-D): zero insertion,
    padding (negative crops), the filter along x then y (convolution, or correlation where
    `flip`), then every `down`-th sample."""
    n, c, h, w = x.shape
    if up > 1:
        x = F.pad(x.reshape(n, c, h, 1, w, 1), [0, up - 1, 0, 0, 0, up - 1]).reshape(n, c, h * up, w * up)
    x = F.pad(x, [max(pad[0], 0), max(pad[1], 0), max(pad[2], 0), max(pad[3], 0)])
    x = x[:, :, max(-pad[2], 0):x.shape[2] - max(-pad[3], 0), max(-pad[0], 0):x.shape[3] - max(-pad[1], 0)]
    taps = f * math.sqrt(gain)
    if not flip:
        taps = taps.flip([0])
    taps = taps.to(x.dtype)[None, None].repeat(c, 1, 1)
    x = F.conv2d(x, taps.unsqueeze(2), groups=c)
    x = F.conv2d(x, taps.unsqueeze(3), groups=c)
    return x[:, :, ::down, ::down]


def _corner(flat: torch.Tensor, xi: torch.Tensor, yi: torch.Tensor, weight: torch.Tensor, h: int,
            w: int) -> torch.Tensor:
    n, c = flat.shape[0], flat.shape[1]
    inside = (xi >= 0) & (xi <= w - 1) & (yi >= 0) & (yi <= h - 1)
    index = (yi.clamp(0, h - 1) * w + xi.clamp(0, w - 1)).to(torch.int64).reshape(n, 1, -1)
    return flat.gather(2, index.expand(n, c, index.shape[2])) * (weight * inside.to(weight.dtype)).reshape(n, 1, -1)


def _bilinear(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """grid_sample(x, grid, bilinear, zeros outside, align_corners=False) written with gathers:
    differentiable in x to every order (the grid takes no gradient)."""
    n, c, h, w = x.shape
    ho, wo = grid.shape[1], grid.shape[2]
    ix = ((grid[..., 0] + 1) * w - 1) / 2
    iy = ((grid[..., 1] + 1) * h - 1) / 2
    x0, y0 = torch.floor(ix), torch.floor(iy)
    fx, fy = ix - x0, iy - y0
    flat = x.reshape(n, c, h * w)
    out = _corner(flat, x0, y0, (1 - fx) * (1 - fy), h, w) + _corner(flat, x0 + 1, y0, fx * (1 - fy), h, w)
    out = out + _corner(flat, x0, y0 + 1, (1 - fx) * fy, h, w) + _corner(flat, x0 + 1, y0 + 1, fx * fy, h, w)
    return out.reshape(n, c, ho, wo)


def _setting(name: str, value) -> float:
    """A pipe's setting as a finite float >= 0: a probability multiplier or a strength. NaN
    turned a transformation off without a word, inf made every image NaN, a string raised
    Python's own TypeError."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise ValueError(f"ganc.augment: {name} is a finite number >= 0, not {value!r}")
    return number


class AugmentPipe(nn.Module):
    """See the module. The arguments are NVIDIA's: each probability multiplier (xflip, ...,
    cutout) scales `p` for its transformation; the *_std, *_max and *_size arguments set its
    strength."""

    def __init__(self, xflip=0, rotate90=0, xint=0, xint_max=0.125, scale=0, rotate=0, aniso=0, xfrac=0,
                 scale_std=0.2, rotate_max=1, aniso_std=0.2, xfrac_std=0.125, brightness=0, contrast=0, lumaflip=0,
                 hue=0, saturation=0, brightness_std=0.2, contrast_std=0.5, hue_max=1, saturation_std=1,
                 imgfilter=0, imgfilter_bands=(1, 1, 1, 1), imgfilter_std=1, noise=0, cutout=0, noise_std=0.1,
                 cutout_size=0.5):
        super().__init__()
        self.register_buffer("p", torch.ones([]))
        args = locals()
        for name in _SETTINGS:
            if name != "imgfilter_bands":
                setattr(self, name, _setting(name, args[name]))
        self.imgfilter_bands: List[float] = [_setting("imgfilter_bands", b) for b in imgfilter_bands]
        if len(self.imgfilter_bands) != 4:
            raise ValueError(f"ganc.augment: imgfilter_bands has 4 entries, one per band (got {len(imgfilter_bands)})")
        geom = _wavelet("sym6")
        self.register_buffer("Hz_geom", torch.as_tensor(geom / geom.sum(), dtype=torch.float32))
        self.register_buffer("Hz_fbank", torch.as_tensor(_filter_bank(_wavelet("sym2")), dtype=torch.float32))
        self.geom_taps = int(geom.size)
        self.fbank_taps = int(self.Hz_fbank.shape[1])

    def _gate(self, value: torch.Tensor, probability: torch.Tensor, identity: float, shape: List[int]) -> torch.Tensor:
        keep = torch.rand(shape, device=value.device) < probability
        return torch.where(keep, value, torch.full_like(value, identity))

    def forward(self, images: torch.Tensor, p: Optional[torch.Tensor] = None) -> torch.Tensor:
        strength = self.p if p is None else p
        images = self._geometric(images, strength)
        images = self._color(images, strength)
        if self.imgfilter > 0:
            images = self._filter(images, strength)
        return self._corrupt(images, strength)

    def _blit(self, g: torch.Tensor, p: torch.Tensor, n: int, h: int, w: int) -> torch.Tensor:
        dev = g.device
        if self.xflip > 0:
            i = self._gate(torch.floor(torch.rand([n], device=dev) * 2), self.xflip * p, 0.0, [n])
            g = g @ _scale2d(1 - 2 * i, torch.ones_like(i))
        if self.rotate90 > 0:
            i = self._gate(torch.floor(torch.rand([n], device=dev) * 4), self.rotate90 * p, 0.0, [n])
            g = g @ _rotate2d(math.pi / 2 * i)
        if self.xint > 0:
            t = (torch.rand([n, 2], device=dev) * 2 - 1) * self.xint_max
            t = self._gate(t, self.xint * p, 0.0, [n, 1])
            g = g @ _translate2d(-torch.round(t[:, 0] * w), -torch.round(t[:, 1] * h))
        return g

    def _general(self, g: torch.Tensor, p: torch.Tensor, n: int, h: int, w: int) -> torch.Tensor:
        dev = g.device
        if self.scale > 0:
            s = self._gate(torch.exp2(torch.randn([n], device=dev) * self.scale_std), self.scale * p, 1.0, [n])
            g = g @ _scale2d(1 / s, 1 / s)
        p_rot = 1 - torch.sqrt((1 - self.rotate * p).clamp(0, 1))  # P(pre or post) = p
        if self.rotate > 0:
            theta = (torch.rand([n], device=dev) * 2 - 1) * math.pi * self.rotate_max
            g = g @ _rotate2d(self._gate(theta, p_rot, 0.0, [n]))
        if self.aniso > 0:
            s = self._gate(torch.exp2(torch.randn([n], device=dev) * self.aniso_std), self.aniso * p, 1.0, [n])
            g = g @ _scale2d(1 / s, s)
        if self.rotate > 0:
            theta = (torch.rand([n], device=dev) * 2 - 1) * math.pi * self.rotate_max
            g = g @ _rotate2d(self._gate(theta, p_rot, 0.0, [n]))
        if self.xfrac > 0:
            t = self._gate(torch.randn([n, 2], device=dev) * self.xfrac_std, self.xfrac * p, 0.0, [n, 1])
            g = g @ _translate2d(-t[:, 0] * w, -t[:, 1] * h)
        return g

    def _geometric(self, images: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Output pixels (centred coordinates) mapped to input pixels by the inverse transform
        g; the image padded by reflection to the bound of any margin, upsampled 2x, sampled
        bilinearly through g, downsampled 2x and cropped back."""
        blit = self.xflip > 0 or self.rotate90 > 0 or self.xint > 0
        general = self.scale > 0 or self.rotate > 0 or self.aniso > 0 or self.xfrac > 0
        if not (blit or general):
            return images
        n, c, h, w = images.shape
        g = torch.eye(3, device=images.device).expand(n, 3, 3)
        g = self._general(self._blit(g, p, n, h, w), p, n, h, w)
        pad = self.geom_taps // 4
        x = F.pad(images, [w - 1, w - 1, h - 1, h - 1], mode="reflect")
        f = self.Hz_geom
        x = _fir(x, f, 2, 1, [(self.geom_taps + 1) // 2, (self.geom_taps - 2) // 2] * 2, 4.0, False)
        # Upsampled centred coordinates are 2x - 1/2 of the image's; then grid_sample's [-1, 1].
        h_out, w_out = (h + pad * 2) * 2, (w + pad * 2) * 2
        one = torch.ones([1], device=images.device)
        to_up = _translate2d(-0.5 * one, -0.5 * one) @ _scale2d(2 * one, 2 * one)
        from_up = _scale2d(0.5 * one, 0.5 * one) @ _translate2d(0.5 * one, 0.5 * one)
        theta = (_scale2d(2 / x.shape[3] * one, 2 / x.shape[2] * one) @ to_up @ g @ from_up
                 @ _scale2d(w_out / 2 * one, h_out / 2 * one))
        grid = F.affine_grid(theta[:, :2, :].to(x.dtype), [n, c, h_out, w_out], align_corners=False)
        x = _bilinear(x, grid)
        crop = -pad * 2
        return _fir(x, f, 1, 2, [crop + (self.geom_taps - 1) // 2, crop + (self.geom_taps - 2) // 2] * 2, 1.0, True)

    def _color(self, images: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        n, c, h, w = images.shape
        dev = images.device
        if not (self.brightness > 0 or self.contrast > 0 or self.lumaflip > 0 or
                (c > 1 and (self.hue > 0 or self.saturation > 0))):
            return images
        eye = torch.eye(4, device=dev)
        m = eye.expand(n, 4, 4)
        v = torch.tensor([1.0, 1.0, 1.0, 0.0], device=dev) / math.sqrt(3)  # the luma axis
        vv = v.outer(v)
        if self.brightness > 0:
            b = self._gate(torch.randn([n], device=dev) * self.brightness_std, self.brightness * p, 0.0, [n])
            o, z = torch.ones_like(b), torch.zeros_like(b)
            m = _affine3d([[o, z, z], [z, o, z], [z, z, o]], [b, b, b]) @ m
        if self.contrast > 0:
            s = self._gate(torch.exp2(torch.randn([n], device=dev) * self.contrast_std), self.contrast * p, 1.0, [n])
            z = torch.zeros_like(s)
            m = _affine3d([[s, z, z], [z, s, z], [z, z, s]], [z, z, z]) @ m
        if self.lumaflip > 0:
            i = self._gate(torch.floor(torch.rand([n, 1, 1], device=dev) * 2), self.lumaflip * p, 0.0, [n, 1, 1])
            m = (eye - 2 * vv * i) @ m  # Householder reflection
        if self.hue > 0 and c > 1:
            theta = (torch.rand([n], device=dev) * 2 - 1) * math.pi * self.hue_max
            m = _rotate3d(v, self._gate(theta, self.hue * p, 0.0, [n])) @ m
        if self.saturation > 0 and c > 1:
            s = torch.exp2(torch.randn([n, 1, 1], device=dev) * self.saturation_std)
            s = self._gate(s, self.saturation * p, 1.0, [n, 1, 1])
            m = (vv + (eye - vv) * s) @ m
        x = images.reshape(n, c, h * w)
        m = m.to(x.dtype)  # the transform drawn in float32 (as the draws), applied in the images' type
        if c == 3:
            x = m[:, :3, :3] @ x + m[:, :3, 3:]
        elif c == 1:
            gray = m[:, :3, :].mean(dim=1, keepdim=True)
            x = x * gray[:, :, :3].sum(dim=2, keepdim=True) + gray[:, :, 3:]
        else:
            raise ValueError("ganc.augment: colour transformations take RGB (3 channels) or L (1 channel) images")
        return x.reshape(n, c, h, w)

    def _filter(self, images: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Each of four frequency bands amplified with probability imgfilter * p * its band's
        multiplier, the gains normalised to the expected power of a 1/f spectrum."""
        n, c, h, w = images.shape
        dev = images.device
        power = torch.tensor([10.0, 1.0, 1.0, 1.0], device=dev) / 13
        gains = torch.ones([n, 4], device=dev)
        band = torch.arange(4, device=dev)
        for i, strength in enumerate(self.imgfilter_bands):
            t_i = torch.exp2(torch.randn([n], device=dev) * self.imgfilter_std)
            t_i = self._gate(t_i, self.imgfilter * p * strength, 1.0, [n])
            t = torch.where(band[None, :] == i, t_i[:, None], torch.ones([n, 4], device=dev))
            gains = gains * (t / (power * t.square()).sum(dim=-1, keepdim=True).sqrt())
        taps = (gains.to(self.Hz_fbank.dtype) @ self.Hz_fbank).to(images.dtype).unsqueeze(1).repeat(1, c, 1).reshape(n * c, 1, -1)
        r = self.fbank_taps // 2
        x = F.pad(images.reshape(1, n * c, h, w), [r, r, r, r], mode="reflect")
        x = F.conv2d(x, taps.unsqueeze(2), groups=n * c)
        x = F.conv2d(x, taps.unsqueeze(3), groups=n * c)
        return x.reshape(n, c, h, w)

    def _corrupt(self, images: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        n, c, h, w = images.shape
        dev = images.device
        if self.noise > 0:
            sigma = torch.randn([n, 1, 1, 1], device=dev).abs() * self.noise_std
            sigma = self._gate(sigma, self.noise * p, 0.0, [n, 1, 1, 1])
            images = images + (torch.randn([n, c, h, w], device=dev) * sigma).to(images.dtype)
        if self.cutout > 0:
            size = self._gate(torch.full([n, 2, 1, 1, 1], self.cutout_size, device=dev), self.cutout * p, 0.0,
                              [n, 1, 1, 1, 1])
            center = torch.rand([n, 2, 1, 1, 1], device=dev)
            xs = torch.arange(w, device=dev).reshape(1, 1, 1, -1)
            ys = torch.arange(h, device=dev).reshape(1, 1, -1, 1)
            outside_x = ((xs + 0.5) / w - center[:, 0]).abs() >= size[:, 0] / 2
            outside_y = ((ys + 0.5) / h - center[:, 1]).abs() >= size[:, 1] / 2
            images = images * (outside_x | outside_y).to(images.dtype)
        return images


# The export's line for NVIDIA's AugmentPipe, which it replaces by ganc's.
REPLACED = ("NVIDIA's AugmentPipe pads each batch by a margin drawn at random (a shape a trace would freeze): "
            "exported as ganc.augment.AugmentPipe, with its settings, p and draws, every shape static")


def is_nvidias(module: nn.Module) -> bool:
    """Whether `module` is NVIDIA's AugmentPipe (by its class name, settings and filter), not ganc's."""
    return (type(module) is not AugmentPipe and type(module).__name__ == "AugmentPipe"
            and all(hasattr(module, name) for name in _SETTINGS) and hasattr(module, "Hz_geom"))


def from_nvidia(pipe: nn.Module) -> AugmentPipe:
    """ganc's pipe with the settings and `p` of NVIDIA's `training.augment.AugmentPipe` (or any
    module with its attributes): the same augmentations, every shape static."""
    missing = [name for name in _SETTINGS if not hasattr(pipe, name)]
    if missing:
        raise ValueError(f"ganc.augment: {type(pipe).__name__} is not an AugmentPipe: it has no {missing[0]!r}")
    ours = AugmentPipe(**{name: getattr(pipe, name) for name in _SETTINGS})
    theirs = dict(pipe.named_buffers())
    for name, buffer in ours.named_buffers():
        if name == "p" and "p" in theirs:
            p = theirs["p"].detach().cpu()
            if not bool(torch.isfinite(p).all()) or not bool(((p >= 0) & (p <= 1)).all()):
                raise ValueError(f"ganc.augment: {type(pipe).__name__}.p is a probability in [0, 1], not "
                                 f"{p.tolist()!r} (NaN turned the augmentation off without a word)")
            buffer.copy_(p)
        elif name != "p" and name in theirs and not torch.allclose(theirs[name].detach().cpu().to(buffer.dtype), buffer, atol=1e-6):
            raise ValueError(f"ganc.augment: {type(pipe).__name__}.{name} is not the filter this pipe uses "
                             f"(PyWavelets' {'sym6' if name == 'Hz_geom' else 'sym2'})")
    return ours
