"""The eager PyTorch training step the benchmarks compare ganc against, in its two styles.

- ``ddp``: the Python model with each trainable submodule already wrapped in
  DistributedDataParallel(find_unused_parameters=True) (mmengine's
  MMSeparateDistributedDataParallel); submodules a phase does not update run under
  no_sync() with requires_grad=False. Phases DDP cannot run (a lazy regulariser's double
  backward leaves a bias without a gradient, and DDP then fails with "gradient which is
  undefined, but still allreduced") run on the unwrapped submodules with the flat
  all-reduce below, as practitioners end up doing.
- ``flat``: no DDP; after backward every non-None gradient is flattened into one buffer,
  all-reduced once and divided by the world size (StyleGAN2-ADA / StyleGAN3).

Both synchronise batch norm, where the spec asks for it, with `CollectiveBatchNorm`
(torch.nn.SyncBatchNorm refuses CPU tensors).
"""
import contextlib

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn

from torch.nn.parallel import DistributedDataParallel as DDP

from ganc.reference import autocast


class CollectiveBatchNorm(torch.nn.Module):
    """Batch norm over every rank's batch, the way eager code gets it on CPU: the per-channel
    sums, sums of squares and the count all-reduced in one collective through
    torch.distributed.nn's differentiable all_reduce (so backward all-reduces their
    gradients); running statistics as torch.nn.SyncBatchNorm updates them (unbiased global
    variance). Takes over the batch norm's parameters and buffers."""

    def __init__(self, bn):
        super().__init__()
        self.weight, self.bias, self.eps, self.momentum = bn.weight, bn.bias, bn.eps, bn.momentum
        self.register_buffer("running_mean", bn.running_mean)
        self.register_buffer("running_var", bn.running_var)

    def forward(self, x):
        if not self.training:
            return torch.nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                                  self.bias, False, 0.0, self.eps)
        xf = x if x.dtype == torch.float64 else x.float()  # statistics in float32 at least
        dims = [0] + list(range(2, x.dim()))
        channels = x.size(1)
        count = torch.full((1,), xf.numel() / channels, dtype=xf.dtype)
        stats = dist_nn.all_reduce(torch.cat([xf.sum(dims), (xf * xf).sum(dims), count]))
        total = stats[-1]
        mean = stats[:channels] / total
        var = stats[channels:2 * channels] / total - mean * mean
        with torch.no_grad():
            self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum)
            self.running_var.lerp_((var * total / (total - 1)).to(self.running_var.dtype), self.momentum)
        shape = [1, channels] + [1] * (x.dim() - 2)
        y = (xf - mean.view(shape)) * (var + self.eps).rsqrt().view(shape)
        return (y * self.weight.view(shape) + self.bias.view(shape)).to(x.dtype)


def synchronise_batch_norm(gan, submodules):
    """The spec's `sync_batch_norm`: every BatchNorm of those submodules made a
    CollectiveBatchNorm (before the optimizers and DDP see the parameters)."""
    for sub in submodules:
        for name, module in list(gan.get_submodule(sub).named_modules()):
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                parent, _, leaf = name.rpartition(".")
                setattr(gan.get_submodule(sub).get_submodule(parent) if parent else gan.get_submodule(sub),
                        leaf, CollectiveBatchNorm(module))


def flat_all_reduce(gan, updates, world):
    grads = [p for s in updates for p in gan._modules[s].parameters() if p.grad is not None]
    if world == 1 or not grads:
        return
    flat = torch.cat([p.grad.flatten() for p in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in grads:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


@contextlib.contextmanager
def unwrapped(gan, subs):
    """The plain submodules in place of their DDP wrappers, for the duration."""
    wrapped = {s: gan._modules[s] for s in subs if isinstance(gan._modules[s], DDP)}
    for s, w in wrapped.items():
        gan._modules[s] = w.module
    try:
        yield
    finally:
        for s, w in wrapped.items():
            gan._modules[s] = w


def iteration(gan, spec, subs, inputs, optimizers, style, world, methods=None, step=0, manual=(),
              scalers=None):
    """One training step: every phase with step % interval == 0, in spec order. `manual`
    names the phases the ``ddp`` style runs without DDP. The spec's training-step features
    run the way each style's users write them: micro-batches under no_sync() but the last
    (``flat``: one all-reduce after the last), each loss divided by their number, the forward
    under torch.autocast, GradScaler (`scalers`, from ganc.reference.grad_scalers()) around backward and
    step, clip_grad_norm_ after the all-reduce (and the unscale)."""
    batches = []
    for phase in spec["phases"]:
        if step % phase.get("interval", 1):
            continue
        reads_data = any(i["source"] in ("data", "labels") for i in phase["inputs"])
        updates = set(phase["updates"])
        for s in subs:
            for p in gan._modules[s].parameters():
                p.requires_grad_(s in updates)
                p.grad = None
        method = methods[phase["name"]] if methods else getattr(gan, phase["method"])
        by_hand = style == "flat" or phase["name"] in manual
        scaler = (scalers or {}).get(phase.get("loss_scaler"))
        micro_batches = phase.get("accumulate", 1)
        precision = phase.get("precision", spec.get("precision", "float32"))
        for micro in range(micro_batches):
            while reads_data and len(batches) <= micro:
                batches.append(inputs.batch())
            args = inputs.for_phase(phase, batches[micro] if reads_data else None)
            last = micro == micro_batches - 1
            with contextlib.ExitStack() as stack:
                if style == "ddp" and phase["name"] in manual:
                    stack.enter_context(unwrapped(gan, subs))
                elif style == "ddp":
                    for s in subs:
                        if s not in updates or not last:
                            stack.enter_context(gan._modules[s].no_sync())
                with autocast(inputs.device.type, precision):
                    loss = method(*args)
                if micro_batches > 1:
                    loss = loss / micro_batches
                (scaler.scale(loss) if scaler else loss).backward()
        if by_hand:
            flat_all_reduce(gan, updates, world)
        for s in phase["updates"]:
            clip = spec["optimizers"][s].get("clip_grad_norm")
            if clip is not None:
                if scaler:
                    scaler.unscale_(optimizers[s])
                torch.nn.utils.clip_grad_norm_(gan._modules[s].parameters(), clip["max_norm"],
                                               float(clip.get("norm_type", 2.0)))
            if scaler:
                scaler.step(optimizers[s])
            else:
                optimizers[s].step()
        if scaler:
            scaler.update()
