"""NumPy draws inside a network that does not script: a draw whose value becomes a tensor as it
was drawn (`Tensor(np.random.normal(0, 1, (n, d)))`, the adversarial autoencoder's and UNIT's
reparameterisation) is recorded as a random op of the same distribution and shape on ganc's
stream, so the network trains as eager DDP trains its archive; what a trace would still freeze
(a draw changed in NumPy first, a Python decision on a draw, a draw in a phase traced whole)
is refused in one line."""
import os
import re
import subprocess

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable

import ganc
from ganc import reference
from conftest import gradient_dumps

Tensor = torch.FloatTensor  # as PyTorch-GAN writes it (torch.cuda.FloatTensor on a GPU)
LATENT = 4
STEPS = 6
SEED = 5


def reparameterization(mu, logvar):
    std = torch.exp(logvar / 2)
    sampled_z = Variable(Tensor(np.random.normal(0, 1, (mu.size(0), LATENT))))
    return sampled_z * std + mu


class Encoder(nn.Module):
    """PyTorch-GAN's adversarial autoencoder's encoder, small: it draws its noise with NumPy."""

    def __init__(self, pixels):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(pixels, 32), nn.LeakyReLU(0.2, inplace=True), nn.Linear(32, 32),
                                   nn.LeakyReLU(0.2, inplace=True))
        self.mu = nn.Linear(32, LATENT)
        self.logvar = nn.Linear(32, LATENT)

    def forward(self, img):
        x = self.model(img.view(img.shape[0], -1))
        return reparameterization(self.mu(x), self.logvar(x))


class NoisyDecoder(nn.Module):
    """Noise of NumPy's other kinds, cast to float32 before it becomes a tensor."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape
        self.model = nn.Sequential(nn.Linear(LATENT, 32), nn.LeakyReLU(0.2, inplace=True),
                                   nn.Linear(32, int(np.prod(shape))), nn.Tanh())

    def forward(self, z):
        jitter = torch.from_numpy(np.random.uniform(-0.1, 0.1, size=z.shape).astype(np.float32))
        img = self.model(z + jitter)
        return img.view(img.shape[0], *self.shape) + 0.01 * torch.tensor(np.random.randn(*self.shape))


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(LATENT, 16), nn.LeakyReLU(0.2, inplace=True), nn.Linear(16, 1),
                                   nn.Sigmoid())

    def forward(self, z):
        return self.model(z)


class Generator(nn.Module):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder


class AAE(nn.Module):
    def __init__(self, encoder=None, decoder=None, shape=(3, 16, 16)):
        super().__init__()
        self.generator = Generator(encoder or Encoder(int(np.prod(shape))), decoder or NoisyDecoder(shape))
        self.discriminator = Discriminator()

    def phase_g(self, real):
        encoded = self.generator.encoder(real)
        decoded = self.generator.decoder(encoded)
        valid = torch.ones(real.size(0), 1)
        return 0.001 * F.binary_cross_entropy(self.discriminator(encoded), valid) + 0.999 * F.l1_loss(decoded, real)

    def phase_d(self, real, z):
        encoded = self.generator.encoder(real).detach()
        real_loss = F.binary_cross_entropy(self.discriminator(z), torch.ones(z.size(0), 1))
        fake_loss = F.binary_cross_entropy(self.discriminator(encoded), torch.zeros(z.size(0), 1))
        return 0.5 * (real_loss + fake_loss)


def aae_spec():
    return {"ganc_spec": 1, "name": "aae", "batch_size": 8, "data": {"shape": [3, 16, 16]},
            "phases": [{"name": "d", "method": "phase_d", "updates": ["discriminator"],
                        "inputs": [{"name": "real", "source": "data"},
                                   {"name": "z", "source": "normal", "shape": [LATENT]}]},
                       {"name": "g", "method": "phase_g", "updates": ["generator"],
                        "inputs": [{"name": "real", "source": "data"}]}],
            "optimizers": {"generator": {"type": "adam", "lr": 2e-4, "betas": [0.5, 0.999]},
                           "discriminator": {"type": "adam", "lr": 2e-4, "betas": [0.5, 0.999]}}}


def where(fn, text):
    import inspect
    lines, start = inspect.getsourcelines(fn)
    return f"test_draws.py:{start + next(i for i, line in enumerate(lines) if text in line)}"


def test_numpy_draws_become_random_ops_and_train_like_eager_ddp(ganc_bin, digits16, tmp_path, capsys):
    """The adversarial autoencoder exports unchanged: its encoder's and decoder's NumPy draws
    (normal; uniform and randn, cast to float32) are random ops of its archive, each call draws
    anew, and at 2 ranks ganc trains it bit for bit like eager DDP on that archive."""
    model = str(tmp_path / "aae.pt")
    ganc.export(AAE(), model, aae_spec())
    said = capsys.readouterr().out
    assert re.search(r"generator\.encoder: traced at .*numpy\.random\.normal\(\) \([^)]*"
                     + re.escape(where(reparameterization, "np.random.normal")) + r"\) drawn by torch\.randn from "
                     r"ganc's random stream", said), said
    assert "numpy.random.uniform()" in said and "numpy.random.randn()" in said and "torch.rand/randn" in said, said
    # A joint graph would hold the draws as constants, the same every step: none is captured,
    # and an archive of joint graphs alone is refused (both once froze them, and trained on).
    assert re.search(r"joint graphs: none \(every phase runs through TorchScript\): numpy\.random\.normal\(\) "
                     r"\(Python randomness\) in generator\.encoder \(.*\) would be the same every step", said), said
    with pytest.raises(ganc.ExportError, match=r"ganc.export\(torchscript=False\): numpy\.random\.normal\(\) .* "
                                               r"would be the same every step in a joint graph"):
        ganc.export(AAE(), str(tmp_path / "aae.ganc"), aae_spec(), torchscript=False)
    loaded = torch.jit.load(model)
    assert "torch.randn(" in loaded.generator.encoder.code and "torch.rand(" in loaded.generator.decoder.code
    x = torch.rand(8, 3, 16, 16) * 2 - 1
    torch.manual_seed(0)
    first = loaded.generator.encoder(x)
    assert not torch.equal(first, loaded.generator.encoder(x))  # a new draw at every call
    torch.manual_seed(0)
    assert torch.equal(first, loaded.generator.encoder(x))  # from torch's generator

    plan = str(tmp_path / "aae.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    run = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", digits16, "--steps",
                          str(STEPS), "--seed", str(SEED), "--out", str(tmp_path / "train"), "--sample-every", "0",
                          "--dump-grads", str(tmp_path / "dump")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    reference.run(model, digits16, 2, STEPS, SEED, str(tmp_path / "ddp"))
    for step, phase, got, ref in gradient_dumps(aae_spec(), STEPS, str(tmp_path / "dump"), str(tmp_path / "ddp")):
        assert all(torch.equal(got[name], ref[name]) for name in ref), (step, phase)
    got = ganc.load_checkpoint(str(tmp_path / "dump" / "params_final.pt"))
    ref = torch.load(str(tmp_path / "ddp" / "params_final.pt"))
    assert set(got) == set(ref) and all(torch.equal(got[name], ref[name]) for name in ref)


class ScaledInNumpy(Encoder):
    def forward(self, img):
        x = self.model(img.view(img.shape[0], -1))
        return self.mu(x) + Tensor(np.random.normal(0, 1, (img.shape[0], LATENT)) * 0.5)


class ConvertsTwice(Encoder):
    def forward(self, img):
        noise = np.random.normal(0, 1, (img.shape[0], LATENT))
        return self.mu(self.model(img.view(img.shape[0], -1))) + Tensor(noise) * Tensor(noise)


class DecidesOnADraw(Encoder):
    def forward(self, img):
        x = self.model(img.view(img.shape[0], -1))
        if np.random.rand() < 0.5:  # one decision for the whole batch: a trace would keep one branch
            x = -x
        return self.mu(x)


@pytest.mark.parametrize("encoder,words", [
    (ScaledInNumpy, r"generator\.encoder \(ScaledInNumpy, .*\): numpy\.random\.normal\(\) \([^)]*test_draws\.py:\d+\) "
                    r"does not reach a tensor as drawn"),
    (ConvertsTwice, r"generator\.encoder \(ConvertsTwice, .*\): numpy\.random\.normal\(\) \([^)]*test_draws\.py:\d+\) "
                    r"becomes a tensor 2 times"),
    (DecidesOnADraw, r"generator\.encoder \([^)]*test_draws\.py:\d+\): numpy\.random\.rand\(\) \(Python randomness\) "
                     r"in a module that does not script"),
])
def test_draws_a_trace_would_still_freeze_are_refused(tmp_path, encoder, words):
    with pytest.raises(ganc.ExportError) as info:
        ganc.export(AAE(encoder(3 * 16 * 16)), str(tmp_path / "m.pt"), aae_spec(), verbose=False)
    message = str(info.value)
    assert "\n" not in message and re.search(words, message), message
    assert not os.path.exists(tmp_path / "m.pt")


def test_a_draw_in_a_phase_traced_whole_is_refused(tmp_path):
    """trace=True traces the phases whole: the draw would be frozen there, and it says so."""
    with pytest.raises(ganc.ExportError) as info:
        ganc.export(AAE(), str(tmp_path / "m.pt"), aae_spec(), trace=True, verbose=False)
    message = str(info.value)
    assert "numpy.random.normal() (Python randomness) in a phase traced whole (trace=True)" in message, message
    assert "export without trace=True" in message, message
