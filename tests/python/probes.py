"""Test-only probe GANs: each exercises one thing the used-parameter analysis or the
CUDA backend must get right (torch.no_grad() D step, an unused head and in-place ops, a host sync)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.mlp import MLPDiscriminator, MLPGAN


# Probes: small GANs that each exercise one thing the used-parameter analysis must get right.

class NoGradGAN(MLPGAN):
    """D phase stops G's gradient with torch.no_grad() instead of .detach()."""

    def phase_d(self, real, z):
        with torch.no_grad():
            fake = self.generator(z)
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()


class AuxDiscriminator(MLPDiscriminator):
    """A discriminator with a head that no phase ever calls, a scale applied in place, and a
    projection whose use depends on a scripted module flag."""

    def __init__(self, hidden=64, use_projection: bool = True):
        super().__init__(hidden)
        self.never_used = nn.Linear(hidden, 3)
        self.scale = nn.Parameter(torch.ones(1))
        self.use_projection = use_projection
        self.projection = nn.Linear(2, 1)
        self.skipped = nn.Linear(2, 1)

    def forward(self, x):
        h = self.net(x)
        h.mul_(self.scale)  # in place: h's later uses must see self.scale
        if self.use_projection:
            h = h + self.projection(x)
        else:
            h = h + self.skipped(x)
        return h


class ProbeGAN(MLPGAN):
    def __init__(self):
        super().__init__()
        self.discriminator = AuxDiscriminator(64, use_projection=True)


class HostSyncGAN(MLPGAN):
    """A G phase that branches on a loss value: the branch reads the tensor on the host, so
    the phase cannot be captured as a CUDA Graph and must replay eagerly."""

    def phase_g(self, z):
        loss = F.softplus(-self.discriminator(self.generator(z))).mean()
        if bool(loss > 10.0):
            loss = loss * 0.1
        return loss


class OverflowingGAN(MLPGAN):
    """A D phase whose float16 loss overflows to inf on every step (a term scaled past
    float16's range): with a loss scaler, that is the scaler's business (GradScaler skips or
    steps on the gradients), not a reason to stop training."""

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        h = self.discriminator(real)
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-h).mean() + (h * 262016.0).abs().mean()


def overflowing_spec(name):
    from zoo.mlp import mlp_spec
    spec = dict(mlp_spec(name, 16), ganc_spec=2, precision="float16",
                loss_scalers={"amp": {"init_scale": 1024.0, "growth_interval": 2}})
    for phase in spec["phases"]:
        phase["loss_scaler"] = "amp"
    return spec


def r1_batch_norm_gan():
    """Lazy R1 through a discriminator with batch norm, synchronised over the ranks: a
    gradient penalty needs the batch norm's double backward, which ganc::sync_batch_norm has
    at one rank (where it is batch norm) and not at more (nor has torch.nn.SyncBatchNorm)."""
    import torch.nn as nn
    from zoo.r1 import R1GAN, r1_spec
    gan = R1GAN()
    gan.discriminator.net.insert(1, nn.BatchNorm1d(gan.discriminator.net[0].out_features))
    spec = dict(r1_spec("probe_r1_syncbn", 16, interval=2), ganc_spec=2, sync_batch_norm=["discriminator"])
    return gan, spec


def register() -> None:
    """Adds the probes to the zoo, so that make_archives.py exports them with the rest."""
    import zoo
    from zoo.mlp import mlp_spec
    zoo.register("probe_nograd", lambda: (NoGradGAN(), mlp_spec("probe_nograd", 16)))
    zoo.register("probe_aux", lambda: (ProbeGAN(), mlp_spec("probe_aux", 16)))
    zoo.register("probe_sync", lambda: (HostSyncGAN(), mlp_spec("probe_sync", 16)))
    zoo.register("probe_overflow", lambda: (OverflowingGAN(), overflowing_spec("probe_overflow")))
    zoo.register("probe_r1_syncbn", r1_batch_norm_gan)
