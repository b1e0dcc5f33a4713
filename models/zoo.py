"""The ganc model zoo: GANs as plain nn.Modules with one method per training phase.

Each entry of ZOO builds (module, spec). The phase methods are ordinary Python; nothing in them
exists to please ganc (no `x * 0` terms to keep DDP happy).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------------------------
# DCGAN (Radford et al.): ConvTranspose2d + BatchNorm + ReLU generator, Conv2d + LeakyReLU
# discriminator, non-saturating logistic loss.

class DCGANGenerator(nn.Module):
    def __init__(self, resolution: int = 64, z_dim: int = 100, width: int = 64, channels: int = 3):
        super().__init__()
        ups = {32: 3, 64: 4}[resolution]
        mult = 2 ** (ups - 1)
        layers = [nn.ConvTranspose2d(z_dim, width * mult, 4, 1, 0, bias=False),
                  nn.BatchNorm2d(width * mult), nn.ReLU(True)]
        for _ in range(ups - 1):
            layers += [nn.ConvTranspose2d(width * mult, width * mult // 2, 4, 2, 1, bias=False),
                       nn.BatchNorm2d(width * mult // 2), nn.ReLU(True)]
            mult //= 2
        layers += [nn.ConvTranspose2d(width, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


class DCGANDiscriminator(nn.Module):
    def __init__(self, resolution: int = 64, width: int = 64, channels: int = 3):
        super().__init__()
        downs = {32: 3, 64: 4}[resolution]
        layers = [nn.Conv2d(channels, width, 4, 2, 1), nn.LeakyReLU(0.2, True)]
        mult = 1
        for _ in range(downs - 1):
            layers += [nn.Conv2d(width * mult, width * mult * 2, 4, 2, 1), nn.LeakyReLU(0.2, True)]
            mult *= 2
        layers += [nn.Conv2d(width * mult, 1, 4, 1, 0)]
        self.main = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x).flatten(1)


class DCGAN(nn.Module):
    def __init__(self, resolution: int = 64, width: int = 64, z_dim: int = 100):
        super().__init__()
        self.generator = DCGANGenerator(resolution, z_dim, width)
        self.discriminator = DCGANDiscriminator(resolution, width)

    def phase_d(self, real: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        fake = self.generator(z).detach()
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()

    def phase_g(self, z: torch.Tensor) -> torch.Tensor:
        return F.softplus(-self.discriminator(self.generator(z))).mean()


def two_phase_spec(name, batch, data_shape, z_shape, lr=2e-4, betas=(0.5, 0.999), buffers="local"):
    adam = {"type": "adam", "lr": lr, "betas": list(betas), "eps": 1e-8, "weight_decay": 0.0}
    z = {"name": "z", "source": "normal", "shape": list(z_shape)}
    return {
        "ganc_spec": 1,
        "name": name,
        "batch_size": batch,
        "data": {"shape": list(data_shape)},
        "phases": [
            {"name": "d", "method": "phase_d", "updates": ["discriminator"], "interval": 1,
             "inputs": [{"name": "real", "source": "data"}, z]},
            {"name": "g", "method": "phase_g", "updates": ["generator"], "interval": 1,
             "inputs": [z]},
        ],
        "optimizers": {"discriminator": dict(adam), "generator": dict(adam)},
        "buffers": buffers,
        "sample": {"submodule": "generator", "noise_shape": list(z_shape)},
    }


# --------------------------------------------------------------------------------------------
# A small MLP GAN on 2-D points (a ring of Gaussians).

def mlp(sizes, act):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


class MLPGenerator(nn.Module):
    def __init__(self, z_dim=8, hidden=64):
        super().__init__()
        self.net = mlp([z_dim, hidden, hidden, 2], nn.ReLU)

    def forward(self, z):
        return self.net(z)


class MLPDiscriminator(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.net = mlp([2, hidden, hidden, 1], lambda: nn.LeakyReLU(0.2))

    def forward(self, x):
        return self.net(x)


class MLPGAN(nn.Module):
    def __init__(self, z_dim=8, hidden=64):
        super().__init__()
        self.generator = MLPGenerator(z_dim, hidden)
        self.discriminator = MLPDiscriminator(hidden)

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()

    def phase_g(self, z):
        return F.softplus(-self.discriminator(self.generator(z))).mean()


# --------------------------------------------------------------------------------------------
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


class R1GAN(MLPGAN):
    """Non-saturating GAN with lazy R1 regularisation (StyleGAN2): the penalty on D's
    gradient at real samples is its own phase, run every `interval` steps with its loss
    multiplied by the interval."""

    def __init__(self, gamma: float = 1.0, interval: int = 4):
        super().__init__()
        self.gamma = gamma
        self.interval = interval

    def phase_dreg(self, real):
        x = real.detach().requires_grad_(True)
        out = self.discriminator(x)
        grads = torch.autograd.grad([out.sum()], [x], create_graph=True)
        g = grads[0]
        assert g is not None
        return g.pow(2).sum(dim=1).mean() * (self.gamma / 2) * self.interval


def r1_spec(name, batch=64, interval=4, lr=1e-3, betas=(0.0, 0.99)):
    """StyleGAN2's lazy-regularisation rule for the regularised submodule's optimizer:
    lr and betas scaled by k/(k+1) for a penalty run every k steps."""
    ratio = interval / (interval + 1)
    spec = mlp_spec(name, batch)
    spec["phases"].insert(1, {"name": "dreg", "method": "phase_dreg", "updates": ["discriminator"],
                              "interval": interval, "inputs": [{"name": "real", "source": "data"}]})
    spec["optimizers"]["discriminator"] = {"type": "adam", "lr": lr * ratio,
                                           "betas": [betas[0] ** ratio, betas[1] ** ratio],
                                           "eps": 1e-8, "weight_decay": 0.0}
    spec["optimizers"]["generator"] = {"type": "adam", "lr": lr, "betas": list(betas), "eps": 1e-8,
                                       "weight_decay": 0.0}
    return spec


class SNLinear(nn.Module):
    """Linear layer with spectral normalisation (Miyato et al.), scriptable: one power
    iteration per call in training mode; `u` is a buffer updated in forward."""

    def __init__(self, fin: int, fout: int):
        super().__init__()
        self.linear = nn.Linear(fin, fout)
        self.register_buffer("u", F.normalize(torch.randn(fout), dim=0))

    def forward(self, x):
        w = self.linear.weight
        with torch.no_grad():
            v = F.normalize(torch.mv(w.t(), self.u), dim=0, eps=1e-12)
            if self.training:
                self.u.copy_(F.normalize(torch.mv(w, v), dim=0, eps=1e-12))
                v = F.normalize(torch.mv(w.t(), self.u), dim=0, eps=1e-12)
            # Snapshots: the next call's update of u must not touch what this backward saved.
            u = self.u.clone()
            v = v.clone()
        sigma = torch.dot(u, torch.mv(w, v))
        return F.linear(x, w / sigma, self.linear.bias)


class SNDiscriminator(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.l1 = SNLinear(2, hidden)
        self.l2 = SNLinear(hidden, hidden)
        self.l3 = SNLinear(hidden, 1)

    def forward(self, x):
        h = F.leaky_relu(self.l1(x), 0.1)
        h = F.leaky_relu(self.l2(h), 0.1)
        return self.l3(h)


class SNGAN(MLPGAN):
    """SNGAN: hinge loss, spectrally normalised discriminator."""

    def __init__(self):
        super().__init__()
        self.discriminator = SNDiscriminator()

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        return F.relu(1.0 + self.discriminator(fake)).mean() + F.relu(1.0 - self.discriminator(real)).mean()

    def phase_g(self, z):
        return -self.discriminator(self.generator(z)).mean()


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


class ConditionalGenerator(nn.Module):
    """DCGAN generator whose input is the noise concatenated with a learned class embedding."""

    def __init__(self, classes=10, embed=16, z_dim=100, width=32):
        super().__init__()
        self.embed = nn.Embedding(classes, embed)
        self.body = DCGANGenerator(32, z_dim + embed, width)

    def forward(self, z, y):
        e = self.embed(y).view(y.size(0), -1, 1, 1)
        return self.body(torch.cat([z, e], 1))


class ProjectionDiscriminator(nn.Module):
    """Projection discriminator (Miyato & Koyama): D(x, y) = psi(phi(x)) + <embed(y), phi(x)>."""

    def __init__(self, classes=10, width=32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(width, width * 2, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(width * 2, width * 4, 4, 2, 1), nn.LeakyReLU(0.2))
        self.psi = nn.Linear(width * 4 * 16, 1)
        self.embed = nn.Embedding(classes, width * 4 * 16)

    def forward(self, x, y):
        phi = self.features(x).flatten(1)
        return self.psi(phi).squeeze(1) + (self.embed(y) * phi).sum(1)


class ConditionalDCGAN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.generator = ConditionalGenerator(classes)
        self.discriminator = ProjectionDiscriminator(classes)

    def phase_d(self, real, labels, z, fake_labels):
        fake = self.generator(z, fake_labels).detach()
        return (F.softplus(self.discriminator(fake, fake_labels)).mean()
                + F.softplus(-self.discriminator(real, labels)).mean())

    def phase_g(self, z, fake_labels):
        return F.softplus(-self.discriminator(self.generator(z, fake_labels), fake_labels)).mean()


def conditional_spec(name, batch=32, classes=10):
    z = {"name": "z", "source": "normal", "shape": [100, 1, 1]}
    y = {"name": "fake_labels", "source": "categorical"}
    spec = two_phase_spec(name, batch, [3, 32, 32], [100, 1, 1])
    spec["data"]["classes"] = classes
    spec["phases"][0]["inputs"] = [{"name": "real", "source": "data"},
                                   {"name": "labels", "source": "labels"}, z, y]
    spec["phases"][1]["inputs"] = [z, y]
    spec["sample"] = {"submodule": "generator", "noise_shape": [100, 1, 1], "classes": classes}
    return spec


# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# StyleGAN2-style (Karras et al. 2020), small: a mapping network z -> w, a synthesis network of
# modulated, demodulated convolutions from a learned 4x4 constant with skip to-RGB outputs, a
# residual discriminator with minibatch standard deviation. Four phases as in StyleGAN2:
# Gmain, Greg (path-length regularisation every 4 steps), Dmain, Dreg (R1 every 16 steps),
# each regulariser's loss multiplied by its interval; G_ema averaged after every step.

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

    def __init__(self, channels: int, w_dim: int):
        super().__init__()
        self.conv0 = ModulatedConv2d(channels, channels, 3, w_dim, up=True)
        self.conv1 = ModulatedConv2d(channels, channels, 3, w_dim)
        self.to_rgb = ModulatedConv2d(channels, 3, 1, w_dim, demodulate=False)

    def forward(self, x: torch.Tensor, img: torch.Tensor, ws: torch.Tensor):
        x = F.leaky_relu(self.conv0(x, ws[:, 0]), 0.2) * math.sqrt(2.0)
        x = F.leaky_relu(self.conv1(x, ws[:, 1]), 0.2) * math.sqrt(2.0)
        img = upsample2d(img)
        return x, img + self.to_rgb(x, ws[:, 2])


class SynthesisNetwork(nn.Module):
    def __init__(self, w_dim: int = 32, channels: int = 32, resolution: int = 32):
        super().__init__()
        self.const = nn.Parameter(torch.randn(1, channels, 4, 4))
        self.conv = ModulatedConv2d(channels, channels, 3, w_dim)
        self.to_rgb = ModulatedConv2d(channels, 3, 1, w_dim, demodulate=False)
        ups = int(math.log2(resolution)) - 2
        self.blocks = nn.ModuleList([SynthesisBlock(channels, w_dim) for _ in range(ups)])
        self.num_ws = 2 + 3 * ups

    def forward(self, ws: torch.Tensor) -> torch.Tensor:
        x = self.const.expand(ws.shape[0], -1, -1, -1)
        x = F.leaky_relu(self.conv(x, ws[:, 0]), 0.2) * math.sqrt(2.0)
        img = self.to_rgb(x, ws[:, 1])
        for i, block in enumerate(self.blocks):
            x, img = block(x, img, ws.narrow(1, 2 + 3 * i, 3))
        return img


class StyleGenerator(nn.Module):
    def __init__(self, z_dim: int = 32, w_dim: int = 32, resolution: int = 32):
        super().__init__()
        self.mapping = MappingNetwork(z_dim, w_dim)
        self.synthesis = SynthesisNetwork(w_dim, resolution=resolution)

    def ws(self, z: torch.Tensor) -> torch.Tensor:
        """One w per synthesis layer (no style mixing): [batch, num_ws, w_dim]."""
        return self.mapping(z).unsqueeze(1).repeat(1, self.synthesis.num_ws, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.synthesis(self.ws(z))


class ResidualDownBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, 1, 1)
        self.conv1 = nn.Conv2d(channels, channels, 3, 1, 1)
        self.skip = nn.Conv2d(channels, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.skip(F.avg_pool2d(x, 2))
        x = F.leaky_relu(self.conv0(x), 0.2) * math.sqrt(2.0)
        x = F.avg_pool2d(F.leaky_relu(self.conv1(x), 0.2) * math.sqrt(2.0), 2)
        return (x + y) / math.sqrt(2.0)


class StyleDiscriminator(nn.Module):
    def __init__(self, channels: int = 32, resolution: int = 32, mbstd_group: int = 4):
        super().__init__()
        self.from_rgb = nn.Conv2d(3, channels, 1)
        self.blocks = nn.ModuleList([ResidualDownBlock(channels)
                                     for _ in range(int(math.log2(resolution)) - 2)])
        self.mbstd_group = mbstd_group
        self.conv = nn.Conv2d(channels + 1, channels, 3, 1, 1)
        self.fc = nn.Linear(channels * 16, channels)
        self.out = nn.Linear(channels, 1)

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
                 pl_weight: float = 2.0, pl_decay: float = 0.01, pl_batch_shrink: int = 2):
        super().__init__()
        self.generator = StyleGenerator()
        self.discriminator = StyleDiscriminator()
        self.generator_ema = StyleGenerator()
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
        pl_mean = self.pl_mean.lerp(lengths.mean().detach(), self.pl_decay)
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


def stylegan2_spec(name, batch=16, lr=0.002, betas=(0.0, 0.99), g_reg=4, d_reg=16, ema_images=500):
    """StyleGAN2's lazy-regularisation rule: a submodule regularised every k steps gets lr and
    betas scaled by k/(k+1)."""
    def adam(k):
        ratio = k / (k + 1)
        return {"type": "adam", "lr": lr * ratio, "betas": [b ** ratio for b in betas], "eps": 1e-8,
                "weight_decay": 0.0}

    z = {"name": "z", "source": "normal", "shape": [32]}
    real = {"name": "real", "source": "data"}
    return {
        "ganc_spec": 1, "name": name, "batch_size": batch, "data": {"shape": [3, 32, 32]},
        "phases": [
            {"name": "Gmain", "method": "phase_gmain", "updates": ["generator"], "inputs": [z]},
            {"name": "Greg", "method": "phase_greg", "updates": ["generator"], "interval": g_reg,
             "inputs": [z, {"name": "pl_noise", "source": "normal", "shape": [3, 32, 32]}]},
            {"name": "Dmain", "method": "phase_dmain", "updates": ["discriminator"], "inputs": [real, z]},
            {"name": "Dreg", "method": "phase_dreg", "updates": ["discriminator"], "interval": d_reg,
             "inputs": [real]},
        ],
        "optimizers": {"generator": adam(g_reg), "discriminator": adam(d_reg)},
        "buffers": "local",
        "ema": {"submodule": "generator", "copy": "generator_ema", "half_life_images": ema_images},
        "sample": {"submodule": "generator_ema", "noise_shape": [32]},
    }


def mlp_spec(name, batch=64):
    spec = two_phase_spec(name, batch, [2], [8], lr=1e-3, betas=(0.5, 0.999))
    return spec


# --------------------------------------------------------------------------------------------

ZOO = {
    "dcgan64": lambda: (DCGAN(64, 64), two_phase_spec("dcgan64", 64, [3, 64, 64], [100, 1, 1])),
    "dcgan32": lambda: (DCGAN(32, 32), two_phase_spec("dcgan32", 32, [3, 32, 32], [100, 1, 1])),
    "mlp": lambda: (MLPGAN(), mlp_spec("mlp")),
    "probe_nograd": lambda: (NoGradGAN(), mlp_spec("probe_nograd", 16)),
    "probe_aux": lambda: (ProbeGAN(), mlp_spec("probe_aux", 16)),
    "probe_sync": lambda: (HostSyncGAN(), mlp_spec("probe_sync", 16)),
    "wgan_gp": lambda: (WGANGP(), wgan_gp_spec("wgan_gp")),
    "cyclegan": lambda: (CycleGAN(), cyclegan_spec("cyclegan")),
    "r1gan": lambda: (R1GAN(), r1_spec("r1gan")),
    "mlp_ema": lambda: (EMAGAN(), ema_spec("mlp_ema")),
    "cdcgan32": lambda: (ConditionalDCGAN(), conditional_spec("cdcgan32")),
    "stylegan2": lambda: (StyleGAN2(), stylegan2_spec("stylegan2")),
    "pggan": lambda: (ProgressiveGAN(), progressive_spec("pggan")),
    # The same GAN with 3-step stages: every stage and both fade-ins within a short test run.
    "pggan_quick": lambda: (ProgressiveGAN(), progressive_spec("pggan_quick", stage_steps=3,
                                                               fade_steps=2)),
    # The power-iteration vectors are buffers: DDP's default policy broadcasts rank 0's.
    "sngan": lambda: (SNGAN(), dict(mlp_spec("sngan"), buffers="broadcast")),
}


def build(name: str):
    if name not in ZOO:
        raise SystemExit(f"unknown model {name!r}; the zoo has: {', '.join(sorted(ZOO))}")
    torch.manual_seed(0)
    return ZOO[name]()
