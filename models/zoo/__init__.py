"""The ganc model zoo: GANs as plain nn.Modules with one method per training phase, one file
per family.

Each entry of ZOO builds (module, spec). The phase methods are ordinary Python; nothing in them
exists to please ganc (no `x * 0` terms to keep DDP happy).
"""
from __future__ import annotations

import torch

from .augment import ADADCGAN, AugmentedDCGAN, ada_spec
from .biggan import BigGAN, biggan_spec
from .conditional import ConditionalDCGAN, conditional_spec
from .cyclegan import CycleGAN, cyclegan_spec
from .cyclegan_pool import CycleGANPool, cyclegan_pool_spec
from .dcgan import DCGAN, training_step_spec, two_phase_spec
from .ema import EMAGAN, ema_spec
from .mlp import MLPDiscriminator, MLPGAN, MLPGANStats, MLPGenerator, mlp, mlp_spec
from .pix2pix import Pix2Pix, pix2pix_spec
from .progressive import ProgressiveGAN, progressive_spec
from .r1 import R1GAN, r1_spec
from .finetune import BranchGAN, TemperatureGAN, freezed_spec, temperature_spec
from .sngan import SNGAN, TorchSNDCGAN
from .stylegan2 import StyleGAN2, stylegan2_spec, upsample2d
from .stylegan2_ada import StyleGAN2ADA, stylegan2_ada_spec
from .stylegan3 import StyleGAN3, stylegan3_spec
from .wgan_gp import WGANGP, wgan_gp_spec

ZOO = {
    "dcgan64": lambda: (DCGAN(64, 64), two_phase_spec("dcgan64", 64, [3, 64, 64], [100, 1, 1])),
    "dcgan32": lambda: (DCGAN(32, 32), two_phase_spec("dcgan32", 32, [3, 32, 32], [100, 1, 1])),
    # bfloat16 autocast, a dynamic loss scaler shared by D and G, D accumulating 2
    # micro-batches per step, G clipped to a 2-norm of 0.1.
    "dcgan32_amp": lambda: (DCGAN(32, 32), training_step_spec("dcgan32_amp", 32, [3, 32, 32],
                                                              [100, 1, 1])),
    # Randomness inside the phases: dropout in D, DiffAugment colour augmentation.
    "dcgan32_augment": lambda: (AugmentedDCGAN(), two_phase_spec("dcgan32_augment", 32, [3, 32, 32],
                                                                 [100, 1, 1])),
    # All five training-step features at once: dcgan32_amp's four and synchronised batch norm
    # in the generator (this DCGAN's discriminator has no batch norm).
    "dcgan32_all": lambda: (DCGAN(32, 32), dict(training_step_spec("dcgan32_all", 32, [3, 32, 32],
                                                                   [100, 1, 1]),
                                                sync_batch_norm=["generator"])),
    # Synchronised batch norm: the generator's BatchNorm statistics over every rank's batch.
    "dcgan32_syncbn": lambda: (DCGAN(32, 32), dict(two_phase_spec("dcgan32_syncbn", 32, [3, 32, 32],
                                                                  [100, 1, 1]),
                                                   ganc_spec=2, sync_batch_norm=["generator"])),
    "mlp": lambda: (MLPGAN(), mlp_spec("mlp")),
    "mlp_stats": lambda: (MLPGANStats(), mlp_spec("mlp_stats")),
    "wgan_gp": lambda: (WGANGP(), wgan_gp_spec("wgan_gp")),
    "cyclegan": lambda: (CycleGAN(), cyclegan_spec("cyclegan")),
    "r1gan": lambda: (R1GAN(), r1_spec("r1gan")),
    "mlp_ema": lambda: (EMAGAN(), ema_spec("mlp_ema")),
    "cdcgan32": lambda: (ConditionalDCGAN(), conditional_spec("cdcgan32")),
    # BigGAN's generator pattern: conditional batch norm (affine=False BatchNorm2d scaled and
    # shifted per class), synchronised over the ranks; projection D, hinge loss.
    "biggan32": lambda: (BigGAN(), biggan_spec("biggan32")),
    "stylegan2": lambda: (StyleGAN2(), stylegan2_spec("stylegan2")),
    # StyleGAN2 written as stylegan2-ada-pytorch writes it (**kwargs forwards, a persistence
    # decorator, numpy, autograd Functions with double backward), exported without edits: the
    # networks traced, the phases scripted. 16 pixels (make_data.py digits --size 16).
    "stylegan2_ada": lambda: (StyleGAN2ADA(), stylegan2_ada_spec("stylegan2_ada")),
    # StyleGAN3-T written as NVIDIA's stylegan3 writes it (Fourier features, filtered_lrelu's
    # reference path with separable filters and crops, a magnitude EMA updated through a
    # keyword argument), StyleGAN2-ADA's discriminator; 16 pixels.
    "stylegan3": lambda: (StyleGAN3(), stylegan3_spec("stylegan3")),
    "pggan": lambda: (ProgressiveGAN(), progressive_spec("pggan")),
    # The same GAN with 3-step stages: every stage and both fade-ins within a short test run.
    "pggan_quick": lambda: (ProgressiveGAN(), progressive_spec("pggan_quick", stage_steps=3,
                                                               fade_steps=2)),
    # The power-iteration vectors are buffers: DDP's default policy broadcasts rank 0's.
    "sngan": lambda: (SNGAN(), dict(mlp_spec("sngan"), buffers="broadcast")),
    # Training part of a network: FreezeD (D's lower convolutions frozen) with a lower
    # learning rate for G's first block; a parameter on the GAN module itself.
    "dcgan32_freezed": lambda: (DCGAN(32, 32), freezed_spec("dcgan32_freezed")),
    "mlp_temperature": lambda: (TemperatureGAN(), temperature_spec("mlp_temperature")),
    # A branch on data: D's head is picked by its input's mean.
    "mlp_branch": lambda: (BranchGAN(), mlp_spec("mlp_branch")),
    # PyTorch's own spectral norm (both APIs) and weight norm, exported by ganc.export.
    "sndcgan32": lambda: (TorchSNDCGAN(), two_phase_spec("sndcgan32", 32, [3, 32, 32], [100, 1, 1])),
    # pix2pix as its reference loop runs: the fake computed once per step in a section, D
    # stepped on it detached, G through it (make_data.py pairs: 16-pixel A|B pairs as channels).
    "pix2pix": lambda: (Pix2Pix(), pix2pix_spec("pix2pix")),
    # CycleGAN as its reference loop runs: forward() once per step in a section, the G step
    # through its four images, the D step on fakes from image history pools of 50 (buffers
    # updated in the phase with its own random draws).
    "cyclegan_pool": lambda: (CycleGANPool(), cyclegan_pool_spec("cyclegan_pool")),
    # Adaptive augmentation (StyleGAN2-ADA's heuristic): p, a controller fed to both phases,
    # adjusted every 2 steps from the mean of sign(D(real)) that phase d logs. Target 0.75 and
    # p from 0.05: in the tests' 10 steps the first interval's mean (0.72) is below the target,
    # so p is clamped at 0, and the later ones (1.0) above it, so p climbs.
    "dcgan32_ada": lambda: (ADADCGAN(), ada_spec("dcgan32_ada", target=0.75, initial=0.05)),
}

# Full-size configurations, for benchmarks and scaling predictions on GPUs (the tests export
# every ZOO entry; these are too large for that). StyleGAN2-ADA's "paper256" configuration:
# 256 pixels, z and w 512, 8 mapping layers, min(16384 / resolution, 512) channels, batch 64
# over 8 GPUs (8 per GPU), G_ema's half-life 20k images; 24.8M parameters in G, 24.0M in D.
LARGE = {
    "stylegan2_256": lambda: (StyleGAN2(z_dim=512, resolution=256, channel_base=16384, mapping_layers=8),
                              stylegan2_spec("stylegan2_256", batch=8, lr=0.0025, ema_images=20000,
                                             z_dim=512, resolution=256)),
}


def register(name: str, make) -> None:
    """Adds a model to ZOO (the tests register their probe GANs this way)."""
    ZOO[name] = make


def build(name: str):
    make = ZOO.get(name, LARGE.get(name))
    if make is None:
        raise SystemExit(f"unknown model {name!r}; the zoo has: {', '.join(sorted(ZOO) + sorted(LARGE))}")
    torch.manual_seed(0)
    return make()


def module(name: str) -> torch.nn.Module:
    """The model `build(name)` makes, without its spec (for references that run the Python
    class eagerly with an archive's weights)."""
    return build(name)[0]
