"""Networks built from torchvision, as GAN code uses them: a frozen VGG feature (perceptual) loss
in the generator's phase, and a ResNet as the encoder of a BiGAN. Random weights (nothing is
downloaded); each exports unchanged and trains at 2 ranks like eager DDP on its archive."""
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ganc
from ganc import reference
from conftest import gradient_dumps

torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed (scripts/setup.sh --tests "
                                                        "installs the release that goes with this torch)")

LATENT = 8
STEPS = 4
SEED = 3


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(LATENT, 32 * 4 * 4)
        self.net = nn.Sequential(nn.ReLU(), nn.Upsample(scale_factor=2), nn.Conv2d(32, 16, 3, padding=1),
                                 nn.BatchNorm2d(16), nn.ReLU(), nn.Upsample(scale_factor=2),
                                 nn.Conv2d(16, 3, 3, padding=1), nn.Tanh())

    def forward(self, z):
        return self.net(self.fc(z).view(-1, 32, 4, 4))


class Critic(nn.Module):
    """A discriminator of images, or (with `latent`) of (image, code) pairs, as BiGAN's."""

    def __init__(self, latent=0):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(16, 32, 4, 2, 1),
                                 nn.LeakyReLU(0.2), nn.Flatten())
        self.head = nn.Linear(32 * 4 * 4 + latent, 1)

    def forward(self, x, code: torch.Tensor | None = None):
        h = self.net(x)
        return self.head(h if code is None else torch.cat([h, code], 1))


class PerceptualGAN(nn.Module):
    """A generator trained with a VGG feature loss beside the adversarial one (SRGAN's and
    pix2pixHD's recipe), the VGG frozen: `requires_grad_(False)` and in no phase's `updates`."""

    def __init__(self):
        super().__init__()
        self.generator = Generator()
        self.discriminator = Critic()
        self.vgg = torchvision.models.vgg11(weights=None).features[:6].eval().requires_grad_(False)

    def phase_d(self, real, z):
        fake = self.generator(z).detach()
        return F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()

    def phase_g(self, real, z):
        fake = self.generator(z)
        return F.softplus(-self.discriminator(fake)).mean() + 0.1 * F.l1_loss(self.vgg(fake), self.vgg(real))


class BiGAN(nn.Module):
    """BiGAN: torchvision's ResNet-18 encodes images to codes; the discriminator tells (x, E(x))
    from (G(z), z); the encoder and the generator train together."""

    def __init__(self):
        super().__init__()
        self.generator = Generator()
        self.encoder = torchvision.models.resnet18(weights=None, num_classes=LATENT)
        self.discriminator = Critic(latent=LATENT)

    def phase_d(self, real, z):
        real_score = self.discriminator(real, self.encoder(real).detach())
        fake_score = self.discriminator(self.generator(z).detach(), z)
        return F.softplus(-real_score).mean() + F.softplus(fake_score).mean()

    def phase_g(self, real, z):
        real_score = self.discriminator(real, self.encoder(real))
        fake_score = self.discriminator(self.generator(z), z)
        return F.softplus(real_score).mean() + F.softplus(-fake_score).mean()


def spec(name, trained_with_g):
    return {"ganc_spec": 2, "name": name, "batch_size": 8, "data": {"shape": [3, 16, 16]},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["discriminator"],
                        "inputs": [{"name": "real", "source": "data"},
                                   {"name": "z", "source": "normal", "shape": [LATENT]}]},
                       {"name": "g", "method": "phase_g", "updates": trained_with_g,
                        "inputs": [{"name": "real", "source": "data"},
                                   {"name": "z", "source": "normal", "shape": [LATENT]}]}],
            "optimizers": {"generator": {"type": "adam", "lr": 2e-4, "betas": [0.5, 0.999]},
                           "discriminator": {"type": "adam", "lr": 2e-4, "betas": [0.5, 0.999]}}}


@pytest.mark.parametrize("gan,gan_spec", [
    (PerceptualGAN, spec("perceptual", ["generator"])),
    (BiGAN, spec("bigan", ["generator", "encoder"])),
], ids=["vgg_feature_loss", "resnet_encoder"])
def test_torchvision_networks_train_like_eager_ddp(ganc_bin, digits16, tmp_path, gan, gan_spec):
    torch.manual_seed(0)
    model = str(tmp_path / "gan.pt")
    ganc.export(gan(), model, gan_spec, verbose=False)
    plan = str(tmp_path / "gan.plan")
    compiled = subprocess.run([ganc_bin, "compile", model, "-o", plan], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    run = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", digits16, "--steps",
                          str(STEPS), "--seed", str(SEED), "--out", str(tmp_path / "train"), "--sample-every", "0",
                          "--dump-grads", str(tmp_path / "dump")], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    reference.run(model, digits16, 2, STEPS, SEED, str(tmp_path / "ddp"))
    trained = set()
    for step, phase, got, ref in gradient_dumps(gan_spec, STEPS, str(tmp_path / "dump"), str(tmp_path / "ddp")):
        assert all(torch.equal(got[name], ref[name]) for name in ref), (step, phase)
        trained |= set(ref)
    assert not any(name.startswith("vgg.") for name in trained)  # the frozen VGG gets no gradient
    if gan is BiGAN:
        assert any(name.startswith("encoder.layer4.") for name in trained)
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    assert set(got) == set(ref) and all(torch.equal(got[name], ref[name]) for name in ref)
