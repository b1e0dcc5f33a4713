"""What the reference builds its training from, as ganc runs it: torch.optim optimizers,
loss scalers, autocast, cuDNN settings, channels-last, the eager twin of an archive, and
ADA's controllers."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..phases import autocast  # noqa: F401  (the reference runs phases under ganc's autocast)


class PhaseRunner(torch.nn.Module):
    """Routes one phase method through a module forward, so DDP sees the computation."""

    def __init__(self, gan, method):
        super().__init__()
        self.gan = gan
        self.method = method

    def forward(self, *inputs):
        out = getattr(self.gan, self.method)(*inputs)
        # (loss, {name: tensor}): the loss; the dict holds logged values and handed-on outputs.
        self.values = out[1] if isinstance(out, tuple) else {}
        return out[0] if isinstance(out, tuple) else out


def make_optimizer(params, spec, cuda=False, zero=False):
    """torch.optim as ganc runs it: single-tensor on CPU, the fused kernels on CUDA.
    `zero`: wrapped in torch.distributed.optim.ZeroRedundancyOptimizer (each rank keeps the
    state of, and steps, its share of the parameters, then broadcasts them)."""
    kind = spec["type"]
    # RMSprop has no fused kernel: ganc's CUDA step is its single-tensor arithmetic.
    impl = {"fused": True} if cuda and kind != "rmsprop" else {"foreach": False}
    cls = {"sgd": torch.optim.SGD, "rmsprop": torch.optim.RMSprop, "adam": torch.optim.Adam}.get(kind, torch.optim.AdamW)
    names = {"sgd": ("momentum", "dampening", "nesterov", "weight_decay"),
             "rmsprop": ("alpha", "eps", "weight_decay", "momentum", "centered")}.get(
        kind, ("betas", "eps", "amsgrad", "weight_decay"))
    settings = dict(lr=spec["lr"], **{n: spec[n] for n in names if n in spec}, **impl)
    if "betas" in settings:
        settings["betas"] = tuple(float(b) for b in settings["betas"])
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, **settings)
    return cls(params, **settings)


def grad_scalers(spec, device="cpu"):
    """One torch.amp.GradScaler per loss scaler the spec names (its settings are GradScaler's
    keyword arguments); phases naming the same scaler share it."""
    return {name: torch.amp.GradScaler(device, **cfg) for name, cfg in spec.get("loss_scalers", {}).items()}


def cuda_determinism(deterministic: bool, benchmark: bool = True):
    """The cuDNN/cuBLAS settings ganc's --deterministic and --cudnn-benchmark choose."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = benchmark and not deterministic


def to_channels_last(module) -> bool:
    """4-D parameters and buffers to NHWC in place, as ganc's --memory-format channels_last
    (and ganc's default on CUDA) does. Returns whether there was any."""
    any_ = False
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.dim() == 4:
                t.data = t.data.contiguous(memory_format=torch.channels_last)
                any_ = True
    return any_


def eager_twin(scripted, module, spec):
    """`module` (the Python class the archive was exported from) with the archive's weights
    and buffers, its `sync_batch_norm` submodules' batch norms made torch.nn.SyncBatchNorm
    (which shares their parameters and buffers)."""
    module = module.to(getattr(torch, spec.get("dtype", "float32")))
    module.load_state_dict(scripted.state_dict())
    for path in spec.get("sync_batch_norm", []):
        *parents, leaf = path.split(".")
        owner = module.get_submodule(".".join(parents)) if parents else module
        setattr(owner, leaf, torch.nn.SyncBatchNorm.convert_sync_batchnorm(getattr(owner, leaf)))
    return module


class Controllers:
    """StyleGAN2-ADA's heuristic as its training loop runs it, for each of the spec's
    controllers: the mean of the phase's logged statistic (its micro-batches' mean per run)
    over every rank since the last adjustment; every `interval` steps, after the step,
    p = max(p + sign(mean - target) * images / (speed_kimg * 1000), 0), images being the
    interval's over every rank. `history[name]` is p after every step."""

    def __init__(self, spec, device):
        dtype = getattr(torch, spec.get("dtype", "float32"))
        self.specs = spec.get("controllers", {})
        self.values = {n: torch.tensor(float(c.get("initial", 0.0)), dtype=dtype, device=device)
                       for n, c in self.specs.items()}
        self.device = device
        self.step = {n: torch.zeros(2, dtype=torch.float64, device=device) for n in self.specs}
        self.totals = {n: torch.zeros(2, dtype=torch.float64, device=device) for n in self.specs}
        self.images = {n: 0 for n in self.specs}
        self.history = {n: [] for n in self.specs}

    def observe(self, phase, logged, micro_batches):
        for n, c in self.specs.items():
            if phase["name"] in c.get("phases", [c.get("phase")]):
                self.step[n][0] += logged[c["statistic"]].detach().double() / micro_batches
                self.step[n][1] += 1.0 / micro_batches

    def end_step(self, done, images):
        for n, c in self.specs.items():
            dist.all_reduce(self.step[n])
            self.totals[n] += self.step[n]
            self.step[n].zero_()
            self.images[n] += images
            if done % c.get("interval", 4) == 0:
                total, count = self.totals[n].tolist()
                if count > 0:
                    mean = total / count
                    sign = 1.0 if mean > c.get("target", 0.6) else -1.0 if mean < c.get("target", 0.6) else 0.0
                    with torch.no_grad():
                        self.values[n].add_(sign * self.images[n] / (c.get("speed_kimg", 500) * 1000.0)).clamp_min_(0.0)
                self.totals[n].zero_()
                self.images[n] = 0
            self.history[n].append(self.values[n].item())
