"""The eager PyTorch training step the benchmarks compare ganc against, in its two styles.

- ``ddp``: the Python model with each trainable submodule already wrapped in
  DistributedDataParallel(find_unused_parameters=True) (mmengine's
  MMSeparateDistributedDataParallel); submodules a phase does not update run under
  no_sync() with requires_grad=False.
- ``flat``: no DDP; after backward every non-None gradient is flattened into one buffer,
  all-reduced once and divided by the world size (StyleGAN2-ADA / StyleGAN3).
"""
import contextlib

import torch
import torch.distributed as dist


def iteration(gan, spec, subs, inputs, optimizers, style, world, methods=None):
    """One training step: every phase that runs at interval 1, in spec order."""
    batch = None
    for phase in spec["phases"]:
        if batch is None and any(i["source"] in ("data", "labels") for i in phase["inputs"]):
            batch = inputs.batch()
        updates = set(phase["updates"])
        for s in subs:
            for p in gan._modules[s].parameters():
                p.requires_grad_(s in updates)
                p.grad = None
        args = inputs.for_phase(phase, batch)
        method = methods[phase["name"]] if methods else getattr(gan, phase["method"])
        with contextlib.ExitStack() as stack:
            if style == "ddp":
                for s in subs:
                    if s not in updates:
                        stack.enter_context(gan._modules[s].no_sync())
            loss = method(*args)
            loss.backward()
        if style == "flat" and world > 1:
            grads = [p for s in updates for p in gan._modules[s].parameters() if p.grad is not None]
            flat = torch.cat([p.grad.flatten() for p in grads])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for p in grads:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        for s in phase["updates"]:
            optimizers[s].step()
