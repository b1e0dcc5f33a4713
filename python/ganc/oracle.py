"""The eager PyTorch reference that ganc is checked (and benchmarked) against.

Each rank loads the same TorchScript archive and spec, draws the same inputs as ganc (data
sharded by DistributedSampler, noise from a generator seeded with seed + rank, drawn in spec
order), and trains with torch.nn.parallel.DistributedDataParallel
(find_unused_parameters=True) around each phase, so that every phase's computation goes
through DDP's forward (or, for models DDP cannot train, with DDP's arithmetic by hand). Submodules a phase does not update have requires_grad=False during it
(as StyleGAN and mmagic do).

Optimizers are torch.optim's, single-tensor (foreach=False), as on CPU by default.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from .exporter import load_spec
from .spec import (fade_at, field_of, lr_scheduler, optimizer_groups, optimizer_settings, pack_fields, stage_at,
                   within)


# ganc seeds the generator random ops inside phases draw from with seed + this + rank.
PHASE_SEED_OFFSET = 1000003


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _optimizer(params, spec, cuda=False, zero=False):
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


def grad_scalers(spec, device="cpu"):
    """One torch.amp.GradScaler per loss scaler the spec names (its settings are GradScaler's
    keyword arguments); phases naming the same scaler share it."""
    return {name: torch.amp.GradScaler(device, **cfg) for name, cfg in spec.get("loss_scalers", {}).items()}


def autocast(device: str, precision: str):
    """torch.autocast for a phase's precision ("float32": none), as ganc applies it."""
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast("cuda" if device == "cuda" else "cpu", dtype=getattr(torch, precision))


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


def _eager_twin(scripted, module, spec):
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


def _start_rank(rank, world, port, device, shared_gpu, deterministic, benchmark, op_libraries):
    """Joins the process group as ganc's ranks do; returns (cuda, this rank's GPU index)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    for library in op_libraries:
        torch.ops.load_library(library)
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    # Run the archive like eager PyTorch (and like ganc): the plain TorchScript interpreter
    # with eager autograd, not the profiling executor's optimised autodiff graphs.
    torch._C._set_graph_executor_optimize(False)
    cuda = device == "cuda"
    # One GPU per rank (NCCL), or every rank on the GPUs there are, over Gloo (`shared_gpu`).
    gpu = rank % torch.cuda.device_count() if cuda and shared_gpu else rank
    if cuda:
        cuda_determinism(deterministic, benchmark)
        torch.cuda.set_device(gpu)
    dist.init_process_group("nccl" if cuda and not shared_gpu else "gloo", rank=rank, world_size=world)
    return cuda, gpu


def _load_data(data_path, spec):
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


def _rank_inputs(spec, data, labels, rank, world, seed, cuda, gpu, global_batch_of, channels_last):
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
            if c["phase"] == phase["name"]:
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


class _EagerTraining:
    """One rank of the eager reference: the model, its phases each wrapped in DDP, the
    optimizers (one torch.optim optimizer per group, as separate param groups of one optimizer
    would be: Adam's and SGD's state and update are per parameter), schedulers, loss scalers
    and EMA, stepped the way ganc steps them."""

    def __init__(self, gan, spec, world, cuda, gpu, reducer, zero):
        self.gan, self.spec, self.world, self.reducer = gan, spec, world, reducer
        self.params = dict(gan.named_parameters())
        self.groups = optimizer_groups(spec, list(self.params))
        self.settings = {g: optimizer_settings(spec, g) for g in self.groups}
        self.optimizers = {g: _optimizer([self.params[n] for n in names], self.settings[g], cuda, zero)
                           for g, names in self.groups.items()}
        # Learning-rate schedules: torch's schedulers, stepped once per training step.
        self.schedulers = [lr_scheduler(self.optimizers[g], self.settings[g]["lr_schedule"])
                           for g in self.groups if "lr_schedule" in self.settings[g]]
        self.runners = self._runners(cuda, gpu)
        self.grad_norms = {}  # phase: [norm per run]
        self.scalers = grad_scalers(spec, "cuda" if cuda else "cpu")
        self.controllers = Controllers(spec, "cuda" if cuda else "cpu")
        self.ema = spec.get("ema")
        if self.ema is not None:
            src, dst = getattr(gan, self.ema["submodule"]), getattr(gan, self.ema["copy"])
            self.ema_pairs = (list(dst.parameters()), list(src.parameters()), list(dst.buffers()),
                              list(src.buffers()))
            half_life = self.ema.get("half_life_images", 0)
            self.ema_beta = (0.5 ** (spec["batch_size"] * world / half_life) if half_life
                             else self.ema.get("beta", 0.999))

    @staticmethod
    def trains(name, updates):
        return any(within(name, u) for u in updates)

    def set_trainable(self, updates):
        for n, p in self.params.items():
            p.requires_grad_(self.trains(n, updates))

    def reducer_of(self, phase):
        return self.reducer.get(phase["name"], "ddp") if isinstance(self.reducer, dict) else self.reducer

    def _runners(self, cuda, gpu):
        """Each phase through a DDP-wrapped forward, built while only what it trains requires
        grad (DDP registers those parameters)."""
        runners = {}
        for phase in self.spec["phases"]:
            if not phase.get("updates"):
                continue  # a section: no backward of its own
            self.set_trainable(set(phase["updates"]))
            runner = PhaseRunner(self.gan, phase["method"])
            if self.reducer_of(phase) != "manual":
                runner = DDP(runner, device_ids=[gpu] if cuda else None, find_unused_parameters=True,
                             broadcast_buffers=self.spec.get("buffers", "local") == "broadcast")
            runners[phase["name"]] = runner
        return runners

    def set_stage(self, index):
        # Eager PyTorch has one model for every stage: the stage is a module attribute its
        # code branches on, and DDP(find_unused_parameters=True) finds the unused blocks.
        for path in self.spec["stages"]["attributes"]:
            *parents, leaf = path.split(".")
            owner = self.gan
            for p in parents:
                owner = getattr(owner, p)
            setattr(owner, leaf, index)

    def section(self, phase, inputs, batches, fade, device, values, taker):
        """A section (a phase without `updates`): its method once per micro-batch, outside any
        DDP (it has no backward of its own), its outputs kept in `values`. The graph is
        recorded for what `taker` (the due phase that takes it through its graph, or None)
        trains; the backward of that phase's DDP forward reaches it and all-reduces them."""
        self.set_trainable(set(taker["updates"]) if taker else set())
        if self.spec.get("buffers", "local") == "broadcast":  # as DDP before a forward
            for b in self.gan.buffers():
                dist.broadcast(b, 0)
        precision = phase.get("precision", self.spec.get("precision", "float32"))
        reads_data = any(i["source"] in ("data", "labels") for i in phase["inputs"])
        with torch.no_grad() if taker is None else contextlib.nullcontext():
            for micro in range(phase.get("accumulate", 1)):
                while reads_data and len(batches) <= micro:
                    batches.append(inputs.batch())
                args = inputs.for_phase(phase, batches[micro] if reads_data else None, fade, values, micro)
                with autocast(device, precision):
                    out = getattr(self.gan, phase["method"])(*args)
                for name in phase["outputs"]:
                    values.setdefault((phase["name"], name), []).append(out[name])

    def backward(self, phase, inputs, batches, fade, device, values=None):
        """The phase's micro-batches forward and backward (the gradients all-reduced by DDP in
        the last, or by hand for a "manual" phase); returns what the phase trains. Its
        `outputs` go to `values`, detached."""
        reads_data = any(i["source"] in ("data", "labels") for i in phase["inputs"])
        updates = set(phase["updates"])
        self.set_trainable(updates)
        for p in self.params.values():
            p.grad = None
        runner = self.runners[phase["name"]]
        scaler = self.scalers.get(phase.get("loss_scaler"))
        micro_batches = phase.get("accumulate", 1)
        precision = phase.get("precision", self.spec.get("precision", "float32"))
        manual = self.reducer_of(phase) == "manual"
        for micro in range(micro_batches):
            while reads_data and len(batches) <= micro:
                batches.append(inputs.batch())
            args = inputs.for_phase(phase, batches[micro] if reads_data else None, fade, values, micro)
            # DDP's no_sync() on every micro-batch but the last: gradients accumulate
            # locally and the last backward all-reduces their sum.
            last = micro == micro_batches - 1
            with contextlib.nullcontext() if last or manual else runner.no_sync():
                with autocast(device, precision):
                    loss = runner(*args)
                logged = (runner.module if isinstance(runner, DDP) else runner).values
                self.controllers.observe(phase, logged, micro_batches)
                for name in phase.get("outputs", []):
                    handed = logged[name]
                    values.setdefault((phase["name"], name), []).append(handed.detach())
                if micro_batches > 1:
                    loss = loss / micro_batches  # the mean over micro-batches
                (scaler.scale(loss) if scaler else loss).backward()
        if manual:
            # DDP's arithmetic without DDP: each gradient scaled by 1/world, then summed.
            for n, p in self.params.items():
                if self.trains(n, updates) and p.grad is not None:
                    p.grad.mul_(1.0 / self.world)
                    dist.all_reduce(p.grad)
        return updates

    def step(self, phase, updates, dump=None):
        """Unscales, clips and steps the optimizer groups of what the phase trains, skipping as
        GradScaler or `non_finite: skip` would; `dump` (a file) receives the gradients first."""
        scaler = self.scalers.get(phase.get("loss_scaler"))
        groups, params = self.groups, self.params
        stepped = [g for g, names in groups.items() if any(self.trains(n, updates) for n in names)]
        # non_finite: skip, without a loss scaler: a step whose all-reduced gradients hold
        # an inf or NaN is skipped, optimizer by optimizer, as GradScaler would skip it.
        skipped = set()
        if not scaler and self.spec.get("non_finite", "stop") == "skip":
            skipped = {g for g in stepped if any(not torch.isfinite(params[n].grad).all()
                                                 for n in groups[g] if params[n].grad is not None)}
        if scaler:
            for g in stepped:
                scaler.unscale_(self.optimizers[g])  # before clipping, as torch.amp's docs say
        trained = [params[n].grad for g in stepped for n in groups[g] if params[n].grad is not None]
        self.grad_norms.setdefault(phase["name"], []).append(
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.double()) for t in trained])).item()
            if trained else 0.0)
        for g in stepped:
            clip = self.settings[g].get("clip_grad_norm")
            if clip is not None:
                norm_type = float(clip.get("norm_type", 2.0))
                torch.nn.utils.clip_grad_norm_([params[n] for n in groups[g]], clip["max_norm"], norm_type)
        if dump:
            torch.save({n: p.grad.detach().cpu().clone() for n, p in params.items()
                        if self.trains(n, updates) and p.grad is not None}, dump)
        for g in stepped:
            if scaler:
                scaler.step(self.optimizers[g])  # skipped on inf/NaN
            elif g not in skipped:
                self.optimizers[g].step()
            else:
                continue
            clamp = self.settings[g].get("clamp_weights")
            if clamp is not None:  # WGAN's weight clipping, over the parameters stepped
                for n in groups[g]:
                    if params[n].grad is not None:
                        params[n].data.clamp_(-clamp, clamp)
        if scaler:
            scaler.update()

    def end_step(self):
        """The learning-rate schedules' step, then the EMA update (StyleGAN2's)."""
        with warnings.catch_warnings():  # a group a later phase steps has not stepped yet
            warnings.simplefilter("ignore", UserWarning)
            for scheduler in self.schedulers:
                scheduler.step()
        if self.ema is not None:
            with torch.no_grad():
                for p_ema, p in zip(self.ema_pairs[0], self.ema_pairs[1]):
                    p_ema.copy_(p.lerp(p_ema, self.ema_beta))
                for b_ema, b in zip(self.ema_pairs[2], self.ema_pairs[3]):
                    b_ema.copy_(b)

    def write_final(self, out_dir):
        # Each phase's gradient norm per run (unscaled, before clipping): ganc's GradNorm/<phase>.
        with open(os.path.join(out_dir, "grad_norms.json"), "w") as f:
            json.dump(self.grad_norms, f)
        torch.save({name: {"scale": sc.get_scale(), "growth_tracker": sc._get_growth_tracker()}
                    for name, sc in self.scalers.items()}, os.path.join(out_dir, "loss_scalers_final.pt"))
        final = {n: p.detach().cpu().clone() for n, p in self.params.items()}
        final.update({n: b.detach().cpu().clone() for n, b in self.gan.named_buffers()})
        torch.save(final, os.path.join(out_dir, "params_final.pt"))
        with open(os.path.join(out_dir, "controllers.json"), "w") as f:
            json.dump(self.controllers.history, f)


def _worker(rank, world, port, archive, data_path, steps, seed, out_dir, device, reducer,
            deterministic=False, benchmark=True, channels_last=False, global_batch_of=0, zero=False,
            shared_gpu=False, eager_model=None, op_libraries=()):
    cuda, gpu = _start_rank(rank, world, port, device, shared_gpu, deterministic, benchmark, op_libraries)
    files = {"ganc.json": ""}
    gan = torch.jit.load(archive, _extra_files=files)
    spec = json.loads(files["ganc.json"])
    if eager_model is not None:
        gan = _eager_twin(gan, eager_model(), spec)
    if cuda:
        gan = gan.to(f"cuda:{gpu}")
    if channels_last:
        channels_last = to_channels_last(gan)
    gan.train()
    data, labels = _load_data(data_path, spec)
    inputs = _rank_inputs(spec, data, labels, rank, world, seed, cuda, gpu, global_batch_of, channels_last)
    training = _EagerTraining(gan, spec, world, cuda, gpu, reducer, zero)
    for r in getattr(inputs, "ranks", [inputs]):
        r.controllers = training.controllers.values
    stages = spec.get("stages")
    for step in range(steps):
        batches = []  # the step's batches: micro-batch j of every phase reads batch j
        fade = 1.0
        if stages is not None:
            training.set_stage(stage_at(stages, step)[0])
            fade = fade_at(stages, step)
        values = {}  # what phases hand on within the step, by (phase, name): one per micro-batch
        due = [p for p in spec["phases"] if step % p.get("interval", 1) == 0]
        for phase in due:
            if not phase.get("updates"):
                taker = next((p for p in due for i in p["inputs"] if i["source"] == "output"
                              and i.get("detach", True) is False
                              and i["output"].rsplit(".", 1)[0] == phase["name"]), None)
                training.section(phase, inputs, batches, fade, device, values, taker)
                continue
            updates = training.backward(phase, inputs, batches, fade, device, values)
            dump = os.path.join(out_dir, f"grads_step{step}_{phase['name']}.pt") if out_dir and rank == 0 else None
            training.step(phase, updates, dump)
        training.controllers.end_step(step + 1, len(batches) * spec["batch_size"] * world)
        training.end_step()
    if out_dir and rank == 0:
        training.write_final(out_dir)
    dist.barrier()  # every rank done, rank 0's files written
    dist.destroy_process_group()
    # The worker's work is done and its files are closed. Skip the interpreter's teardown:
    # at exit PyTorch's Gloo threads now and then abort the process ("terminate called
    # without an active exception", about 1 run in 12 at 2 ranks, with or without ganc).
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(archive, data_path, world, steps, seed, out_dir, device="cpu", reducer="ddp",
        deterministic=False, benchmark=True, channels_last=False, global_batch=False, zero=False,
        shared_gpu=False, eager_model=None, op_libraries=()):
    """Trains `steps` steps on `world` ranks (Gloo on CPU, NCCL with one GPU per rank on
    CUDA); rank 0 writes the all-reduced gradients of every step and phase, and the final
    parameters and buffers, to `out_dir`.

    reducer="ddp" (the default) is DistributedDataParallel(find_unused_parameters=True).
    reducer="manual" all-reduces every non-None gradient after backward with DDP's arithmetic
    (x 1/world, then SUM), for models eager DDP cannot train: a lazy R1 phase makes DDP fail
    with "Encountered gradient which is undefined, but still allreduced by DDP reducer".
    A dict {phase name: "ddp" | "manual"} chooses per phase (default "ddp").
    On CUDA, `deterministic` and `benchmark` are ganc's --deterministic and --cudnn-benchmark;
    `channels_last` is its --memory-format channels_last (its default on CUDA).
    `global_batch`: one process trains on the `world` ranks' data and noise concatenated,
    the reference for synchronised batch norm (which is defined to equal it; eager
    SyncBatchNorm refuses CPU tensors). The model must draw no randomness inside its phases.
    `zero`: every optimizer is a ZeroRedundancyOptimizer (the reference for ganc's `zero`).
    `shared_gpu`: on CUDA, the ranks share the GPUs there are (rank % GPUs) over Gloo, as
    ganc's `--dist-backend gloo` does (NCCL takes one GPU per rank).
    `eager_model`: a picklable callable returning the Python module the archive was exported
    from; the reference then runs that module eagerly with the archive's weights, and the
    batch norms of the spec's `sync_batch_norm` submodules are torch.nn.SyncBatchNorm (on
    CUDA tensors only: SyncBatchNorm refuses CPU ones). A spec with `sync_batch_norm` at more
    than one rank needs this or `global_batch`: the archive alone has per-rank batch norm.
    `op_libraries`: TORCH_LIBRARY operator libraries the archive (and the eager model) call.
    """
    for library in op_libraries:
        torch.ops.load_library(library)
    spec = load_spec(archive)
    if spec.get("sync_batch_norm") and world > 1 and not global_batch and eager_model is None:
        raise ValueError(f"{archive}: its spec synchronises batch norm ('sync_batch_norm'); the eager "
                         "reference at more than one rank needs global_batch=True or eager_model=")
    os.makedirs(out_dir, exist_ok=True)
    procs = 1 if global_batch else world
    mp.spawn(_worker, args=(procs, free_port(), archive, data_path, steps, seed, out_dir, device, reducer,
                            deterministic, benchmark, channels_last, world if global_batch else 0, zero,
                            shared_gpu, eager_model, tuple(op_libraries)),
             nprocs=procs, join=True)
