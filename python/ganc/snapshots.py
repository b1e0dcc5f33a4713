"""Network snapshots in StyleGAN's format, from a ganc checkpoint: the `network-snapshot-KIMG.pkl`
that NVIDIA's generate.py, projector.py and calc_metrics.py load (a pickle of a dict holding
G, D and G_ema as modules of your own classes), so a run trained with ganc goes on into their
tools."""
from __future__ import annotations

import copy
import os
import pickle

import torch

from .exporter import read_checkpoint

__all__ = ["stylegan_snapshot"]


def stylegan_snapshot(checkpoint: str, out_dir: str, training_set_kwargs: dict | None = None,
                      **modules: torch.nn.Module) -> str:
    """Writes `out_dir/network-snapshot-KIMG.pkl` from ganc's `checkpoint` and returns its path.

    `modules` are fresh instances of your classes by the name of the GAN's submodule they
    are (`G=Generator(...), D=Discriminator(...), G_ema=Generator(...)`): each takes that
    submodule's trained parameters and buffers (strictly: every name must match), and is
    pickled as StyleGAN's training loop pickles it (a copy, in eval mode, without gradients,
    on the CPU). KIMG is the thousands of real images the checkpoint had trained on. A
    submodule the checkpoint does not hold is refused, naming what it holds. An `augment_pipe`
    (NVIDIA's AugmentPipe or ganc's, as their training loop pickles it) takes the p that ADA's
    controller (`augment_p`, ganc.recipes') had reached. A damaged checkpoint (its CRC-32 seal
    or an entry's) raises ValueError naming it, as `ganc train --resume` refuses it."""
    if not modules:
        raise ValueError("ganc.stylegan_snapshot: give the networks to pickle by the GAN's submodule names "
                         "(G=Generator(...), D=Discriminator(...), G_ema=Generator(...)); none was given")
    state = read_checkpoint(checkpoint, "ganc.stylegan_snapshot")
    held = sorted(k for k, v in state.items() if isinstance(v, dict) and k not in ("optimizers", "best"))
    snapshot = {"training_set_kwargs": training_set_kwargs, "augment_pipe": None}
    for name, module in modules.items():
        if name not in state or not isinstance(state[name], dict):
            raise ValueError(f"ganc.stylegan_snapshot: {checkpoint} holds no submodule {name!r} "
                             f"(it holds {', '.join(held)})")
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"ganc.stylegan_snapshot: {name} is a {type(module).__name__}, not a torch.nn.Module")
        module = copy.deepcopy(module)
        try:
            module.load_state_dict(state[name], strict=True)
        except RuntimeError as e:
            why = " ".join(str(e).split())
            raise ValueError(f"ganc.stylegan_snapshot: {name} ({type(module).__name__}) does not take the "
                             f"checkpoint's {name!r}: {why[:300]}") from None
        snapshot[name] = module.eval().requires_grad_(False).cpu()
    ada = state.get("controllers", {}).get("augment_p")
    if ada is not None and snapshot["augment_pipe"] is not None and hasattr(snapshot["augment_pipe"], "p"):
        snapshot["augment_pipe"].p.copy_(ada["value"].reshape(snapshot["augment_pipe"].p.shape))
    kimg = int(state.get("images", 0)) // 1000
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"network-snapshot-{kimg:06d}.pkl")
    try:
        with open(path + ".tmp", "wb") as f:
            pickle.dump(snapshot, f)
        os.replace(path + ".tmp", path)
    finally:
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")
    return path
