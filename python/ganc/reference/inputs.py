"""The reference's inputs, drawn as ganc draws them: the data sharded by
DistributedSampler, noise from a generator seeded with seed + rank, in spec order."""
from __future__ import annotations

import torch

from ..spec import field_of, pack_fields


# ganc seeds the generator random ops inside phases draw from with seed + this + rank.
PHASE_SEED_OFFSET = 1000003


class Inputs:
    """ganc's input streams: DistributedSampler batches and per-rank seeded noise."""

    def __init__(self, spec, data, rank, world, seed, device="cpu"):
        self.spec, self.data, self.rank, self.world, self.seed = spec, data, rank, world, seed
        self.device = torch.device(device)
        self.labels = None
        self.controllers = {}  # name: the controller's value (a 0-dim tensor), set by the trainer
        self.channels_last = False  # NHWC data batches (ganc's --memory-format channels_last)
        if self.device.type == "cuda":
            # ganc draws GPU noise from the default CUDA generator (graph-safe under capture).
            torch.cuda.manual_seed(seed + rank)
            self.noise = None
        else:
            self.noise = torch.Generator().manual_seed(seed + rank)
        self.dtype = getattr(torch, spec.get("dtype", "float32"))
        self.epoch = 0
        self._batches = None
        if data is not None:
            self.sampler = torch.utils.data.DistributedSampler(  
                range(len(data)), num_replicas=world, rank=rank, shuffle=True, seed=seed,
                drop_last=False)
            self._start_epoch()

    def _start_epoch(self):
        self.sampler.set_epoch(self.epoch)
        # A loader of its own generator: each new iterator draws a base seed from the loader's
        # generator, which by default is the global one that random ops inside the phases draw
        # from (an epoch boundary would shift their draws; ganc's phase generator has no such
        # draw).
        loader = torch.utils.data.DataLoader(range(len(self.data)), batch_size=self.spec["batch_size"],
                                             sampler=self.sampler, drop_last=True,
                                             generator=torch.Generator())
        self._batches = iter(loader)

    def batch(self):
        """The step's (samples, labels or None)."""
        try:
            idx = next(self._batches)
        except StopIteration:
            self.epoch += 1
            self._start_epoch()
            idx = next(self._batches)
        labels = self.labels[idx].to(self.device) if self.labels is not None else None
        samples = self.data[idx].to(self.device)
        if self.channels_last and samples.dim() == 4:
            samples = samples.contiguous(memory_format=torch.channels_last)
        return samples, labels

    def for_phase(self, phase, batch, fade=1.0, values=None, micro=0):
        """The phase's inputs; `values[(phase, name)][micro]` holds what earlier phases of
        the step handed on (taken detached unless the input says "detach": false)."""
        out = []
        for inp in phase["inputs"]:
            if inp["source"] == "controller":
                out.append(self.controllers[inp["controller"]])
            elif inp["source"] == "output":
                value = values[tuple(inp["output"].rsplit(".", 1))][micro]
                out.append(value if inp.get("detach", True) is False else value.detach())
            elif inp["source"] == "fade":
                out.append(torch.tensor(fade, dtype=self.dtype, device=self.device))
            elif inp["source"] == "data":
                out.append(field_of(self.spec, inp.get("field"), batch[0]))
            elif inp["source"] == "labels":
                out.append(batch[1])
            elif inp["source"] == "categorical":
                classes = inp.get("classes", self.spec["data"].get("classes", 0))
                out.append(torch.randint(classes, (self.spec["batch_size"],), generator=self.noise,
                                         device=self.device))
            else:
                draw = torch.rand if inp["source"] == "uniform" else torch.randn
                out.append(draw([self.spec["batch_size"]] + inp["shape"], generator=self.noise,
                                device=self.device).to(self.dtype))
        return out


class GlobalInputs:
    """The inputs of `world` ranks concatenated along the batch, for one process: what
    synchronised batch norm over those ranks is defined to equal."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.dtype = ranks[0].dtype

    def batch(self):
        batches = [r.batch() for r in self.ranks]
        labels = None if batches[0][1] is None else torch.cat([b[1] for b in batches])
        return torch.cat([b[0] for b in batches]), labels

    def for_phase(self, phase, batch, fade=1.0, values=None, micro=0):
        # Each rank draws its own noise; the data batch is already the concatenation.
        per_rank = [r.for_phase(phase, batch, fade, values, micro) for r in self.ranks]
        out = []
        for i, inp in enumerate(phase["inputs"]):
            if inp["source"] in ("data", "labels", "fade", "output", "controller"):
                out.append(per_rank[0][i])
            else:
                out.append(torch.cat([args[i] for args in per_rank]))
        return out


def load_data(data_path, spec):
    """The data file as ganc reads it: images (in the spec's dtype) and labels, or (None, None)."""
    if not data_path:
        return None, None
    data, labels = torch.load(data_path), None
    if isinstance(data, dict):
        labels = data.get("labels")
        data = pack_fields(spec, data) if spec["data"].get("fields") else data["images"]
    data = (data if data.dtype == torch.float64 else data.float()).to(getattr(torch, spec.get("dtype", "float32")))
    if spec["data"].get("xflip"):  # the set doubled with mirrored images, as ganc does
        data = torch.cat([data, data.flip(-1)])
        labels = torch.cat([labels, labels]) if labels is not None else None
    return data, labels


def rank_inputs(spec, data, labels, rank, world, seed, cuda, gpu, global_batch_of, channels_last):
    """This rank's inputs (or, with `global_batch_of`, every rank's concatenated)."""
    inputs = Inputs(spec, data, rank, world, seed, f"cuda:{gpu}" if cuda else "cpu")
    if global_batch_of:
        inputs = GlobalInputs([Inputs(spec, data, r, global_batch_of, seed) for r in range(global_batch_of)])
    if not cuda:
        # Random ops inside the phase methods draw from the default generator, seeded per rank
        # as ganc seeds it (on CUDA it is the noise generator, seeded by Inputs).
        torch.manual_seed(seed + PHASE_SEED_OFFSET + rank)
    for r in getattr(inputs, "ranks", [inputs]):
        r.channels_last = channels_last
        r.labels = labels.long() if labels is not None else None
    return inputs
