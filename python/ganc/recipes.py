"""Training recipes: StyleGAN2's loss with StyleGAN2-ADA's train.py presets, around any generator
and discriminator with NVIDIA's call signatures.

    from ganc import recipes
    gan, spec = recipes.stylegan2(G, D, cfg="paper256", gpus=8)
    ganc.export(gan, "stylegan2.pt", spec)

`G` has `G.mapping(z, c)` and `G.synthesis(ws)` and `z_dim`, `c_dim`, `img_resolution`,
`img_channels` (NVIDIA's networks unchanged, the zoo's, a user's written the same way); `D(img, c)`
its logits. The phases are StyleGAN2Loss's (stylegan2-ada-pytorch's training/loss.py): Gmain,
Greg (path length, every 4 steps, on half the batch), Dmain and Dreg (R1, every 16), with style
mixing; the optimizers are train.py's Adam with training_loop's lazy-regularisation scaling of
the learning rate and betas, G_ema its EMA (half-life `ema_kimg` thousand images, ramped up
where the preset does). A preset's network sizes (mapping depth, channel base, minibatch-std
group) are for building G and D: `preset(...).network_kwargs()`.

`r3gan(G, D, gamma=...)` is R3GAN's loss (its training/loss.py): the relativistic pairing loss
(RpGAN) with zero-centred gradient penalties on the real (R1) and the generated (R2) images,
both every step, for a `G(z, c)` and a `D(img, c)`.

`stylegan2(..., augment="bgc")` adds StyleGAN2-ADA's augmentation (`ganc.augment`): D sees
every image through the pipe (train.py's `--augpipe`; NVIDIA's own AugmentPipe instance is
taken as well), its probability p adjusted by ADA's controller (`ada_target`, train.py's
`--target`; every 4 steps by `ada_kimg`) or fixed (`ada_target=None`, `augment_p`: train.py's
`--aug fixed --p`)."""
from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass, field, replace
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["PRESETS", "NoAugment", "R3GANLoss", "StyleGAN2Loss", "StyleGAN2Preset", "preset", "r3gan", "stylegan2"]


@dataclass(frozen=True)
class StyleGAN2Preset:
    """What stylegan2-ada-pytorch's `train.py --cfg` sets (its cfg_specs, then
    setup_training_loop_kwargs and training_loop's defaults)."""
    cfg: str
    ref_gpus: int
    kimg: int
    batch: int  # images per step over every GPU
    mbstd: int
    fmaps: float
    lr: float
    gamma: float
    ema_kimg: float
    ema_rampup: float | None
    map: int
    pl_weight: float = 2.0
    style_mixing_prob: float = 0.9
    pl_batch_shrink: int = 2
    pl_decay: float = 0.01
    g_reg_interval: int = 4
    d_reg_interval: int = 16
    betas: tuple = field(default=(0.0, 0.99))
    eps: float = 1e-8

    @property
    def batch_gpu(self) -> int:
        return self.batch // self.ref_gpus

    @property
    def channel_base(self) -> int:
        return int(self.fmaps * 32768)

    def optimizer(self, interval: int) -> dict:
        """Adam for a network regularised every `interval` steps: training_loop's mb_ratio
        scales the learning rate and each beta (beta ** ratio)."""
        ratio = interval / (interval + 1) if interval > 0 else 1.0
        return {"type": "adam", "lr": self.lr * ratio, "betas": [b ** ratio for b in self.betas], "eps": self.eps}

    def network_kwargs(self) -> dict:
        """The sizes train.py gives NVIDIA's Generator and Discriminator."""
        g = {"z_dim": 512, "w_dim": 512, "mapping_kwargs": {"num_layers": self.map},
             "synthesis_kwargs": {"channel_base": self.channel_base, "channel_max": 512, "num_fp16_res": 4,
                                  "conv_clamp": 256}}
        d = {"channel_base": self.channel_base, "channel_max": 512, "num_fp16_res": 4, "conv_clamp": 256,
             "epilogue_kwargs": {"mbstd_group_size": self.mbstd}}
        if self.cfg == "cifar":
            d["architecture"] = "orig"
        return {"G": g, "D": d}


# stylegan2-ada-pytorch's train.py cfg_specs ('auto' is filled in by preset()).
PRESETS = {
    "auto": StyleGAN2Preset("auto", -1, 25000, -1, -1, -1, -1, -1, -1, 0.05, 2),
    "stylegan2": StyleGAN2Preset("stylegan2", 8, 25000, 32, 4, 1, 0.002, 10, 10, None, 8),
    "paper256": StyleGAN2Preset("paper256", 8, 25000, 64, 8, 0.5, 0.0025, 1, 20, None, 8),
    "paper512": StyleGAN2Preset("paper512", 8, 25000, 64, 8, 1, 0.0025, 0.5, 20, None, 8),
    "paper1024": StyleGAN2Preset("paper1024", 8, 25000, 32, 4, 1, 0.002, 2, 10, None, 8),
    "cifar": StyleGAN2Preset("cifar", 2, 100000, 64, 32, 1, 0.0025, 0.01, 500, 0.05, 2, pl_weight=0.0,
                             style_mixing_prob=0.0),
}


def preset(cfg: str, resolution: int, gpus: int = 1, **overrides) -> StyleGAN2Preset:
    """train.py's configuration `cfg` for images of `resolution` pixels on `gpus` GPUs; 'auto'
    derives batch, minibatch-std group, channel base, learning rate, R1 gamma and EMA from them
    as train.py does. `overrides` (gamma=, batch=, kimg=, ...) replace fields as train.py's
    options do (--gamma, --batch, --kimg)."""
    if cfg not in PRESETS:
        raise ValueError(f"ganc.recipes: no StyleGAN2 preset {cfg!r} (presets: {', '.join(PRESETS)})")
    if gpus < 1 or resolution < 4 or resolution & (resolution - 1):
        raise ValueError(f"ganc.recipes: {cfg}: gpus must be at least 1 and resolution a power of two of at least "
                         f"4 (got gpus={gpus}, resolution={resolution})")
    p = PRESETS[cfg]
    if cfg == "auto":
        mb = max(min(gpus * min(4096 // resolution, 32), 64), gpus)
        p = replace(p, ref_gpus=gpus, batch=mb, mbstd=min(mb // gpus, 4), fmaps=1 if resolution >= 512 else 0.5,
                    lr=0.002 if resolution >= 1024 else 0.0025, gamma=0.0002 * resolution ** 2 / mb,
                    ema_kimg=mb * 10 / 32)
    unknown = sorted(set(overrides) - set(StyleGAN2Preset.__dataclass_fields__))
    if unknown:
        raise ValueError(f"ganc.recipes: {cfg}: no setting {unknown[0]!r}")
    p = replace(p, **overrides)
    _check_preset(p)
    if "batch" in overrides:
        # train.py's --batch: each GPU then takes batch // gpus images per pass (no accumulation),
        # where the preset's own batch is split over the GPUs it was tuned for.
        if p.batch % gpus:
            raise ValueError(f"ganc.recipes: {cfg}: a batch of {p.batch} does not divide over {gpus} GPUs "
                             "(train.py: --batch must be at least 1 and divisible by --gpus)")
        p = replace(p, ref_gpus=gpus)
    return p


# Each number a preset holds, with what it must be: (name, integer, lowest, lowest allowed).
_PRESET_RULES = (("batch", True, 1, True), ("kimg", False, 0, False), ("mbstd", True, 1, True),
                 ("fmaps", False, 0, False), ("lr", False, 0, False), ("gamma", False, 0, True),
                 ("ema_kimg", False, 0, True), ("map", True, 1, True), ("pl_weight", False, 0, True),
                 ("style_mixing_prob", False, 0, True), ("pl_batch_shrink", True, 1, True),
                 ("pl_decay", False, 0, True), ("g_reg_interval", True, 0, True), ("d_reg_interval", True, 0, True),
                 ("eps", False, 0, False))


def _number(value, integer: bool) -> bool:
    if isinstance(value, bool):
        return False
    if integer:
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return isinstance(value, (int, float)) and math.isfinite(value)


def _check_preset(p: StyleGAN2Preset) -> None:
    """Refuses, naming the setting, a value train.py would refuse or that would train something
    else silently (batch 0 became 1; gamma -1 or NaN dropped the R1 phase)."""
    for name, integer, low, inclusive in _PRESET_RULES:
        value = getattr(p, name)
        if not _number(value, integer) or not (value >= low if inclusive else value > low):
            what = "an integer" if integer else "a finite number"
            bound = f">= {low}" if inclusive else f"> {low}"
            raise ValueError(f"ganc.recipes: {p.cfg}: {name} is {what} {bound}, not {value!r}")
    if p.style_mixing_prob > 1:
        raise ValueError(f"ganc.recipes: {p.cfg}: style_mixing_prob is a probability in [0, 1], "
                         f"not {p.style_mixing_prob!r}")
    if not (isinstance(p.betas, (tuple, list)) and len(p.betas) == 2
            and all(_number(b, False) and 0 <= b < 1 for b in p.betas)):
        raise ValueError(f"ganc.recipes: {p.cfg}: betas are two numbers in [0, 1), not {p.betas!r}")


class NoAugment(nn.Module):
    """The pipe of a run without augmentation: images as they are."""

    def forward(self, images: torch.Tensor, p: Optional[torch.Tensor] = None) -> torch.Tensor:
        return images


class StyleGAN2Loss(nn.Module):
    """StyleGAN2Loss's phases as methods around `G`, `D` and `G_ema` (see the module); D sees
    every image through `augment_pipe` (a `ganc.augment.AugmentPipe`), whose p is the phase's
    last argument where the method's name ends in `_a` (ADA's controller), else its own `p`."""

    def __init__(self, G: nn.Module, D: nn.Module, p: StyleGAN2Preset, G_ema: nn.Module | None = None,
                 augment_pipe: nn.Module | None = None):
        super().__init__()
        self.G = G
        self.D = D
        self.augment_pipe = augment_pipe if augment_pipe is not None else NoAugment()
        self.G_ema = G_ema if G_ema is not None else copy.deepcopy(G).eval().requires_grad_(False)
        self.register_buffer("pl_mean", torch.zeros([]))
        self.c_dim = int(getattr(G, "c_dim", 0))
        self.style_mixing_prob = float(p.style_mixing_prob)
        self.pl_weight = float(p.pl_weight)
        self.pl_decay = float(p.pl_decay)
        self.pl_batch_shrink = int(p.pl_batch_shrink)
        self.r1_gamma = float(p.gamma)
        self.g_reg_interval = int(p.g_reg_interval)
        self.d_reg_interval = int(p.d_reg_interval)
        # How G's mapping network moves w_avg, the truncation centre, as NVIDIA's losses call
        # it: stylegan2-ada-pytorch's moves it in every call in training mode but the style
        # mixing one (`skip_w_avg_update=True`); the stylegan3 repository's only when asked
        # (`update_emas=True`: in Dmain's generator run, never in the mixing call). The
        # attribute that is set says which (TorchScript compiles only the branch it names).
        mapping = getattr(G, "mapping", None)
        takes = inspect.signature(mapping.forward).parameters if isinstance(mapping, nn.Module) else {}
        if "skip_w_avg_update" in takes:
            self.mapping_skips_w_avg_update = True
        elif "update_emas" in takes:
            self.mapping_updates_emas = True

    def one_hot(self, labels: torch.Tensor) -> torch.Tensor:
        return F.one_hot(labels, self.c_dim).to(torch.float32)

    def run_g(self, z: torch.Tensor, c: torch.Tensor, update_emas: bool = False):
        """G's images and styles, as NVIDIA's run_G: w_avg moves where their loss moves it
        (`update_emas`: Dmain's generator run), never in the style mixing call."""
        if hasattr(self, "mapping_updates_emas"):
            ws = self.G.mapping(z, c, update_emas=update_emas)
        else:
            ws = self.G.mapping(z, c)
        if self.style_mixing_prob > 0:
            num_ws = ws.shape[1]
            cutoff = torch.randint(1, num_ws, [1], device=ws.device)
            mix = torch.rand([1], device=ws.device) < self.style_mixing_prob
            cutoff = torch.where(mix, cutoff, torch.full_like(cutoff, num_ws))
            if hasattr(self, "mapping_skips_w_avg_update"):
                other = self.G.mapping(torch.randn_like(z), c, skip_w_avg_update=True)
            elif hasattr(self, "mapping_updates_emas"):
                other = self.G.mapping(torch.randn_like(z), c, update_emas=False)
            else:
                other = self.G.mapping(torch.randn_like(z), c)
            later = (torch.arange(num_ws, device=ws.device) >= cutoff).view(1, num_ws, 1)
            ws = torch.where(later, other, ws)
        return self.G.synthesis(ws), ws

    def run_d(self, img: torch.Tensor, c: torch.Tensor, p: Optional[torch.Tensor]):
        return self.D(self.augment_pipe(img, p), c)

    def gmain(self, z: torch.Tensor, c: torch.Tensor, p: Optional[torch.Tensor] = None):
        img, _ = self.run_g(z, c)
        return F.softplus(-self.run_d(img, c, p)).mean()

    def greg(self, z: torch.Tensor, c: torch.Tensor):
        n = z.shape[0] // self.pl_batch_shrink
        img, ws = self.run_g(z[:n], c[:n])
        noise = torch.randn_like(img) / math.sqrt(img.shape[2] * img.shape[3])
        grads = torch.autograd.grad([(img * noise).sum()], [ws], create_graph=True)[0]
        assert grads is not None
        lengths = grads.square().sum(2).mean(1).sqrt()
        pl_mean = self.pl_mean.lerp(lengths.mean(), self.pl_decay)  # as StyleGAN2Loss: not detached here
        self.pl_mean.copy_(pl_mean.detach())
        return ((lengths - pl_mean).square() * self.pl_weight).mean() * self.g_reg_interval

    def dmain(self, real: torch.Tensor, real_c: torch.Tensor, z: torch.Tensor, gen_c: torch.Tensor,
              p: Optional[torch.Tensor] = None):
        """The loss, and the mean sign of D's real logits (ADA's statistic, `signs_real`)."""
        fake, _ = self.run_g(z, gen_c, update_emas=True)
        loss_gen = F.softplus(self.run_d(fake.detach(), gen_c, p)).mean()
        real_logits = self.run_d(real, real_c, p)
        return loss_gen + F.softplus(-real_logits).mean(), {"signs_real": real_logits.sign().mean()}

    def dreg(self, real: torch.Tensor, c: torch.Tensor, p: Optional[torch.Tensor] = None):
        """R1, and the mean sign of its real logits (ADA's statistic counts them too)."""
        x = real.detach().requires_grad_(True)
        real_logits = self.run_d(x, c, p)
        grads = torch.autograd.grad([real_logits.sum()], [x], create_graph=True)[0]
        assert grads is not None
        penalty = (grads.square().sum([1, 2, 3]) * (self.r1_gamma / 2)).mean() * self.d_reg_interval
        return penalty, {"signs_real": real_logits.detach().sign().mean()}

    # The phases of an unconditional G: c is [n, 0].
    def phase_gmain(self, z: torch.Tensor):
        return self.gmain(z, torch.zeros([z.shape[0], 0], device=z.device))

    def phase_greg(self, z: torch.Tensor):
        return self.greg(z, torch.zeros([z.shape[0], 0], device=z.device))

    def phase_dmain(self, real: torch.Tensor, z: torch.Tensor):
        c = torch.zeros([z.shape[0], 0], device=z.device)
        return self.dmain(real, c, z, c)

    def phase_dreg(self, real: torch.Tensor):
        return self.dreg(real, torch.zeros([real.shape[0], 0], device=real.device))

    # The sample grid: G_ema(z, c) with c of no classes, or one-hot of classes cycling 0, 1, ...
    def sample_grid(self, z: torch.Tensor):
        return self.G_ema(z, torch.zeros([z.shape[0], 0], device=z.device))

    def sample_grid_c(self, z: torch.Tensor, labels: torch.Tensor):
        return self.G_ema(z, self.one_hot(labels))

    # The phases of a conditional G: the real images' labels, and random classes for the fakes.
    def phase_gmain_c(self, z: torch.Tensor, gen_c: torch.Tensor):
        return self.gmain(z, self.one_hot(gen_c))

    def phase_greg_c(self, z: torch.Tensor, gen_c: torch.Tensor):
        return self.greg(z, self.one_hot(gen_c))

    def phase_dmain_c(self, real: torch.Tensor, labels: torch.Tensor, z: torch.Tensor, gen_c: torch.Tensor):
        return self.dmain(real, self.one_hot(labels), z, self.one_hot(gen_c))

    def phase_dreg_c(self, real: torch.Tensor, labels: torch.Tensor):
        return self.dreg(real, self.one_hot(labels))

    # The same with the augmentation probability p as the last argument (ADA's controller).
    def phase_gmain_a(self, z: torch.Tensor, p: torch.Tensor):
        return self.gmain(z, torch.zeros([z.shape[0], 0], device=z.device), p)

    def phase_dmain_a(self, real: torch.Tensor, z: torch.Tensor, p: torch.Tensor):
        c = torch.zeros([z.shape[0], 0], device=z.device)
        return self.dmain(real, c, z, c, p)

    def phase_dreg_a(self, real: torch.Tensor, p: torch.Tensor):
        return self.dreg(real, torch.zeros([real.shape[0], 0], device=real.device), p)

    def phase_gmain_c_a(self, z: torch.Tensor, gen_c: torch.Tensor, p: torch.Tensor):
        return self.gmain(z, self.one_hot(gen_c), p)

    def phase_dmain_c_a(self, real: torch.Tensor, labels: torch.Tensor, z: torch.Tensor, gen_c: torch.Tensor,
                        p: torch.Tensor):
        return self.dmain(real, self.one_hot(labels), z, self.one_hot(gen_c), p)

    def phase_dreg_c_a(self, real: torch.Tensor, labels: torch.Tensor, p: torch.Tensor):
        return self.dreg(real, self.one_hot(labels), p)


def _spec(gan: StyleGAN2Loss, p: StyleGAN2Preset, gpus: int, batch_gpu: int | None, ada: dict | None) -> dict:
    G = gan.G
    per_gpu = batch_gpu or max(1, min(p.batch_gpu, p.batch // gpus))
    if p.batch % (per_gpu * gpus):
        raise ValueError(f"ganc.recipes: {p.cfg}: a batch of {p.batch} does not split into {gpus} GPUs of "
                         f"{per_gpu} (train.py's --batch must be a multiple of --gpus times --batch-gpu)")
    accumulate = p.batch // (per_gpu * gpus)
    z = {"name": "z", "source": "normal", "shape": [int(G.z_dim)]}
    real = {"name": "real", "source": "data"}
    conditional = gan.c_dim > 0
    suffix = "_c" if conditional else ""
    gen = [z, {"name": "gen_c", "source": "categorical"}] if conditional else [z]
    reals = [real, {"name": "labels", "source": "labels"}] if conditional else [real]
    # The phases that call D take ADA's p last.
    aug, p_in = ("_a", [{"name": "p", "source": "controller", "controller": "augment_p"}]) if ada else ("", [])
    phases = [{"name": "Gmain", "method": "phase_gmain" + suffix + aug, "updates": ["G"], "inputs": gen + p_in}]
    if p.pl_weight > 0:
        phases.append({"name": "Greg", "method": "phase_greg" + suffix, "updates": ["G"],
                       "interval": p.g_reg_interval, "inputs": gen})
    phases.append({"name": "Dmain", "method": "phase_dmain" + suffix + aug, "updates": ["D"],
                   "inputs": reals + gen + p_in})
    if p.gamma > 0:
        phases.append({"name": "Dreg", "method": "phase_dreg" + suffix + aug, "updates": ["D"],
                       "interval": p.d_reg_interval, "inputs": reals + p_in})
    if accumulate > 1:
        for phase in phases:
            phase["accumulate"] = accumulate
    ema = {"submodule": "G", "copy": "G_ema", "half_life_images": p.ema_kimg * 1000}
    if p.ema_rampup is not None:
        ema["rampup"] = p.ema_rampup
    g_int = p.g_reg_interval if p.pl_weight > 0 else 0
    d_int = p.d_reg_interval if p.gamma > 0 else 0
    c = inspect.signature(G.forward).parameters.get("c")
    if not conditional and c is not None and c.default is not inspect.Parameter.empty:
        sample = {"submodule": "G_ema", "noise_shape": [int(G.z_dim)]}  # G_ema(z): c has a default
    else:  # G_ema(z, c): a method of the loss calls it (`--metrics` need G_ema(z) alone)
        sample = {"method": "sample_grid" + suffix,
                  "inputs": [z, {"name": "labels", "source": "categorical"}] if conditional else [z]}
    # accumulate, ema.rampup, the grid's method and controllers are version 2's
    version = 2 if accumulate > 1 or p.ema_rampup is not None or "method" in sample or ada else 1
    spec = {"ganc_spec": version, "name": f"stylegan2_{p.cfg}", "batch_size": per_gpu,
            "data": {"shape": [int(G.img_channels), int(G.img_resolution), int(G.img_resolution)]},
            "phases": phases,
            "optimizers": {"G": p.optimizer(g_int), "D": p.optimizer(d_int)},
            "ema": ema, "sample": sample}
    if conditional:
        spec["data"]["classes"] = gan.c_dim
    if ada:
        # The statistic of StyleGAN2-ADA's loop: the signs of every real logit D gives, in Dmain
        # and in R1's Dreg alike (both report Loss/signs/real).
        spec["controllers"] = {"augment_p": {**ada, "phases": [ph["name"] for ph in phases
                                                               if ph["name"] in ("Dmain", "Dreg")]}}
    return spec


def _augment_pipe(augment) -> nn.Module | None:
    """`augment` as ganc's pipe: a name of train.py's --augpipe, ganc's pipe, or NVIDIA's
    AugmentPipe (the same settings and p, its shapes made static: see ganc.augment)."""
    from . import augment as pipes
    if augment is None or isinstance(augment, pipes.AugmentPipe):
        return augment
    if isinstance(augment, str):
        if augment not in pipes.PIPES:
            raise ValueError(f"ganc.recipes: no augmentation pipe {augment!r} (train.py's --augpipe: "
                             f"{', '.join(pipes.PIPES)})")
        return pipes.AugmentPipe(**pipes.PIPES[augment])
    if isinstance(augment, nn.Module):
        ours = pipes.from_nvidia(augment)
        print(f"ganc.recipes: augment_pipe: replaced ({pipes.REPLACED})")  # as ganc.export says it
        return ours
    raise ValueError(f"ganc.recipes: augment is a pipe's name, ganc.augment.AugmentPipe or NVIDIA's AugmentPipe "
                     f"(got {type(augment).__name__})")


def stylegan2(G: nn.Module, D: nn.Module, cfg: str = "auto", gpus: int = 1, G_ema: nn.Module | None = None,
              batch_gpu: int | None = None, augment=None, augment_p: float = 0.0, ada_target: float | None = 0.6,
              ada_kimg: float = 500, **overrides):
    """(the GAN to export, its spec): StyleGAN2's loss around `G` and `D` with train.py's preset
    `cfg` for `gpus` GPUs (the images' resolution is G's), and `overrides` of the preset
    (gamma=, batch=, ...). Each GPU takes `batch_gpu` images per pass (stylegan3's --batch-gpu;
    by default train.py's: the preset's batch // ref_gpus, at most batch // gpus, or batch //
    gpus where `batch` is given), accumulating up to the batch.

    `augment` (train.py's --augpipe: "bgc", ...; or a pipe) puts StyleGAN2-ADA's augmentation in
    front of D, with p from `augment_p` adjusted by ADA (the mean sign of D's real logits in
    Dmain against `ada_target`, every 4 steps, by the images seen over `ada_kimg` thousand:
    train.py's --target and training_loop's ada_interval and ada_kimg) or fixed at `augment_p`
    where `ada_target` is None (train.py's --aug fixed --p)."""
    p = preset(cfg, int(G.img_resolution), gpus, **overrides)
    pipe = _augment_pipe(augment)
    if not _number(augment_p, False) or not 0 <= augment_p <= 1 or not _number(ada_kimg, False) or ada_kimg <= 0:
        raise ValueError(f"ganc.recipes: augment_p is in [0, 1] and ada_kimg above 0 (got {augment_p}, {ada_kimg})")
    if ada_target is not None and (not _number(ada_target, False) or not 0 <= ada_target <= 1):
        raise ValueError(f"ganc.recipes: ada_target is the mean sign of D's real logits to aim at, in [0, 1] "
                         f"(train.py's --target), or None for a fixed p; not {ada_target!r}")
    if batch_gpu is not None and (not _number(batch_gpu, True) or batch_gpu < 1):
        raise ValueError(f"ganc.recipes: batch_gpu is the images each GPU takes per pass, an integer >= 1, or None "
                         f"for train.py's default; not {batch_gpu!r}")
    ada = None
    if pipe is not None and pipe.imgfilter > 0 and int(G.img_resolution) <= pipe.fbank_taps // 2:
        raise ValueError(f"ganc.recipes: augment {augment if isinstance(augment, str) else 'pipe'!r}: its image "
                         f"filter pads each image by {pipe.fbank_taps // 2} pixels by reflection, which needs images "
                         f"larger than that (G makes {int(G.img_resolution)} pixels); take a pipe without the "
                         "filter ('bgc') or larger images")
    if pipe is not None:
        pipe.p.fill_(augment_p)
        if ada_target is not None:
            ada = {"type": "ada", "statistic": "signs_real", "target": float(ada_target),
                   "interval": 4, "speed_kimg": float(ada_kimg), "initial": float(augment_p)}
    gan = StyleGAN2Loss(G, D, p, G_ema, pipe)
    return gan, _spec(gan, p, gpus, batch_gpu, ada)


class R3GANLoss(nn.Module):
    """R3GAN's AdversarialTraining as phase methods around `G(z, c)` and `D(img, c)`."""

    def __init__(self, G: nn.Module, D: nn.Module, gamma: float, G_ema: nn.Module | None = None):
        super().__init__()
        self.G = G
        self.D = D
        self.G_ema = G_ema if G_ema is not None else copy.deepcopy(G).eval().requires_grad_(False)
        self.c_dim = int(getattr(G, "c_dim", 0))
        self.gamma = float(gamma)

    def one_hot(self, labels: torch.Tensor) -> torch.Tensor:
        return F.one_hot(labels, self.c_dim).to(torch.float32)

    def g_loss(self, real: torch.Tensor, z: torch.Tensor, c: torch.Tensor):
        fake_logits = self.D(self.G(z, c), c)
        real_logits = self.D(real.detach(), c)
        return F.softplus(-(fake_logits - real_logits)).mean()

    def d_loss(self, real: torch.Tensor, z: torch.Tensor, c: torch.Tensor):
        real = real.detach().requires_grad_(True)
        fake = self.G(z, c).detach().requires_grad_(True)
        real_logits = self.D(real, c)
        fake_logits = self.D(fake, c)
        r1 = torch.autograd.grad([real_logits.sum()], [real], create_graph=True)[0]
        r2 = torch.autograd.grad([fake_logits.sum()], [fake], create_graph=True)[0]
        assert r1 is not None and r2 is not None
        penalty = r1.square().sum([1, 2, 3]) + r2.square().sum([1, 2, 3])
        return (F.softplus(-(real_logits - fake_logits)) + (self.gamma / 2) * penalty).mean()

    def phase_g(self, real: torch.Tensor, z: torch.Tensor):
        return self.g_loss(real, z, torch.zeros([z.shape[0], 0], device=z.device))

    def phase_d(self, real: torch.Tensor, z: torch.Tensor):
        return self.d_loss(real, z, torch.zeros([z.shape[0], 0], device=z.device))

    def phase_g_c(self, real: torch.Tensor, labels: torch.Tensor, z: torch.Tensor):
        return self.g_loss(real, z, self.one_hot(labels))

    def phase_d_c(self, real: torch.Tensor, labels: torch.Tensor, z: torch.Tensor):
        return self.d_loss(real, z, self.one_hot(labels))


def r3gan(G: nn.Module, D: nn.Module, gamma: float, batch_gpu: int, lr: float = 2e-4, betas=(0.0, 0.9),
          eps: float = 1e-8, ema_kimg: float = 500.0, G_ema: nn.Module | None = None):
    """(the GAN to export, its spec): R3GAN's loss around `G(z, c)` and `D(img, c)`, Adam with
    R3GAN's starting `lr` and `betas` for both, D's step then G's, G_ema with a half-life of
    `ema_kimg` thousand images. R3GAN decays its learning rate, beta2, gamma and EMA half-life
    over training (cosine schedules): here they are constants; a learning-rate schedule can be
    added to the spec's optimizers (`lr_schedule`)."""
    if not _number(gamma, False) or gamma < 0 or not _number(batch_gpu, True) or batch_gpu < 1:
        raise ValueError(f"ganc.recipes: r3gan: gamma must be >= 0 and batch_gpu >= 1 (got {gamma}, {batch_gpu})")
    gan = R3GANLoss(G, D, gamma, G_ema)
    conditional = gan.c_dim > 0
    real = [{"name": "real", "source": "data"}] + ([{"name": "labels", "source": "labels"}] if conditional else [])
    z = {"name": "z", "source": "normal", "shape": [int(G.z_dim)]}
    suffix = "_c" if conditional else ""
    adam = {"type": "adam", "lr": lr, "betas": list(betas), "eps": eps}
    spec = {"ganc_spec": 1, "name": "r3gan", "batch_size": batch_gpu,
            "data": {"shape": [int(G.img_channels), int(G.img_resolution), int(G.img_resolution)]},
            "phases": [{"name": "D", "method": "phase_d" + suffix, "updates": ["D"], "inputs": real + [z]},
                       {"name": "G", "method": "phase_g" + suffix, "updates": ["G"], "inputs": real + [z]}],
            "optimizers": {"G": dict(adam), "D": dict(adam)},
            "ema": {"submodule": "G", "copy": "G_ema", "half_life_images": ema_kimg * 1000}}
    if conditional:
        spec["data"]["classes"] = gan.c_dim
    return gan, spec
