"""The eager PyTorch reference that ganc is checked (and benchmarked) against.

Each rank loads the same TorchScript archive and spec, draws the same inputs as ganc (data
sharded by DistributedSampler, noise from a generator seeded with seed + rank, drawn in spec
order), and trains with torch.nn.parallel.DistributedDataParallel
(find_unused_parameters=True) around each phase, so that every phase's computation goes
through DDP's forward (or, for models DDP cannot train, with DDP's arithmetic by hand). Submodules a phase does not update have requires_grad=False during it
(as StyleGAN and mmagic do).

Optimizers are torch.optim's, single-tensor (foreach=False), as on CPU by default.
"""
from .inputs import PHASE_SEED_OFFSET, GlobalInputs, Inputs, load_data
from .launch import free_port, run
from .recipe import autocast, cuda_determinism, grad_scalers, make_optimizer, to_channels_last

__all__ = ["PHASE_SEED_OFFSET", "GlobalInputs", "Inputs", "autocast", "cuda_determinism", "free_port", "grad_scalers",
           "load_data", "make_optimizer", "run", "to_channels_last"]
