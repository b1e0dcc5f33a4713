"""One rank of the eager reference: each phase through DistributedDataParallel, the
optimizers, schedules, loss scalers and EMA stepped the way ganc steps them."""
from __future__ import annotations

import contextlib
import json
import os
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ..spec import lr_scheduler, optimizer_groups, optimizer_settings, within
from .recipe import Controllers, PhaseRunner, autocast, grad_scalers, make_optimizer


class EagerTraining:
    """One rank of the eager reference: the model, its phases each wrapped in DDP, the
    optimizers (one torch.optim optimizer per group, as separate param groups of one optimizer
    would be: Adam's and SGD's state and update are per parameter), schedulers, loss scalers
    and EMA, stepped the way ganc steps them."""

    def __init__(self, gan, spec, world, cuda, gpu, reducer, zero):
        self.gan, self.spec, self.world, self.reducer = gan, spec, world, reducer
        self.params = dict(gan.named_parameters())
        self.groups = optimizer_groups(spec, list(self.params))
        self.settings = {g: optimizer_settings(spec, g) for g in self.groups}
        self.optimizers = {g: make_optimizer([self.params[n] for n in names], self.settings[g], cuda, zero)
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
            # StyleGAN's batch: every micro-batch of the step, over every rank.
            micro = max([p.get("accumulate", 1) for p in spec["phases"]
                         if any(i["source"] in ("data", "labels") for i in p["inputs"])], default=1)
            self.ema_images = spec["batch_size"] * world * micro
            self.ema_half_life = self.ema.get("half_life_images", 0)
            self.ema_beta = (0.5 ** (self.ema_images / self.ema_half_life) if self.ema_half_life
                             else self.ema.get("beta", 0.999))
        self.images_seen = 0  # real images over every rank before this step (train.py's cur_nimg)

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

    def end_step(self, images):
        """The learning-rate schedules' step, then the EMA update (StyleGAN2's, with its ramp-up),
        after a step that trained on `images` real images over every rank."""
        with warnings.catch_warnings():  # a group a later phase steps has not stepped yet
            warnings.simplefilter("ignore", UserWarning)
            for scheduler in self.schedulers:
                scheduler.step()
        if self.ema is not None:
            if self.ema.get("rampup"):  # train.py: ema_nimg = min(ema_nimg, cur_nimg * ema_rampup)
                ramped = min(self.ema_half_life, self.images_seen * self.ema["rampup"])
                self.ema_beta = 0.5 ** (self.ema_images / max(ramped, 1e-8))
            with torch.no_grad():
                for p_ema, p in zip(self.ema_pairs[0], self.ema_pairs[1]):
                    p_ema.copy_(p.lerp(p_ema, self.ema_beta))
                for b_ema, b in zip(self.ema_pairs[2], self.ema_pairs[3]):
                    b_ema.copy_(b)
        self.images_seen += images

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
