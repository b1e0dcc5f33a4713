"""ganc from Python: compile an archive to a plan, look at the plan, train from it.

    import ganc
    plan = ganc.compile("dcgan32.pt")                 # -> dcgan32.plan, a ganc.Plan
    print(plan.explain())
    plan.used("d"), plan.buckets("g")                 # the analysis, as Python data
    summary = ganc.train(plan, data="digits.pt", nproc=2, steps=500, out="runs/dcgan")

Both run the `ganc` driver (training is one process per rank either way); its progress is
echoed as it comes, so a notebook shows it, and a failure raises GancError with the driver's
one-line message and exit code (2: bad input, 1: a rank failed).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field

from .cli import environment, executable

__all__ = ["Plan", "GancError", "GancWarning", "compile", "simulate", "train"]


class GancError(RuntimeError):
    """The driver failed: `message` is its error line, `exit_code` 2 for bad input and 1 for
    a failure while training."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class GancWarning(UserWarning):
    """The driver warned (`ganc: warning: ...` on its stderr) while a call that does not echo
    its output ran: the prediction or plan it returns is complete but the warning qualifies it."""


def _run(args: list[str], echo: bool) -> str:
    """Runs the driver; returns its stdout. stdout and stderr are echoed line by line while
    it runs (when `echo`; otherwise its warnings are raised as GancWarning); a non-zero exit
    raises GancError with its last error line."""
    proc = subprocess.Popen([executable(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, bufsize=1, env=environment())
    out: list[str] = []
    err: list[str] = []

    def pump(stream, lines, sink):
        for line in stream:
            lines.append(line)
            if echo:
                sink.write(line)
                sink.flush()

    threads = [threading.Thread(target=pump, args=(proc.stdout, out, sys.stdout), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err, sys.stderr), daemon=True)]
    for t in threads:
        t.start()
    try:
        code = proc.wait()
    except BaseException as e:  # KeyboardInterrupt in a notebook: stop the run, then re-raise
        # A Ctrl-C goes on as SIGINT, so that the run names the signal the user sent (from its
        # parent, it is never taken for a second Ctrl-C); anything else stops it as SIGTERM.
        if isinstance(e, KeyboardInterrupt):
            proc.send_signal(signal.SIGINT)
        else:
            proc.terminate()
        proc.wait()
        for t in threads:
            t.join(timeout=10)
        if not echo:  # where it stopped and its checkpoint, said even when quiet
            sys.stderr.write("".join(err))
        raise
    for t in threads:
        t.join()
    if code != 0:
        errors = [line.strip() for line in err if line.strip()]
        message = errors[-1] if errors else f"ganc {args[0]} exited with status {code}"
        raise GancError(message.removeprefix("ganc: error: "), code)
    if not echo:
        for line in err:
            if line.startswith("ganc: warning: "):
                warnings.warn(line.strip().removeprefix("ganc: warning: "), GancWarning, stacklevel=3)
    return "".join(out)


@dataclass
class Plan:
    """A compiled plan: its file, the archive it was compiled from, and its content (the
    JSON `ganc compile --emit json` prints)."""
    path: str
    model: str | None
    data: dict = field(repr=False)

    @classmethod
    def load(cls, path: str, model: str | None = None) -> "Plan":
        """Reads a plan file (checked like `ganc train` checks it)."""
        return cls(path, model, json.loads(_run(["explain", "--json", path], echo=False)))

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def phases(self) -> list[str]:
        """Phase names (for a progressive GAN, `phase@stage` keys), in plan order."""
        return [_key(p) for p in self.data["phases"]]

    def phase(self, name: str) -> dict:
        for p in self.data["phases"]:
            if _key(p) == name:
                return p
        raise KeyError(f"plan {self.path}: no phase {name!r} (phases: {', '.join(self.phases)})")

    def used(self, phase: str) -> list[str]:
        """The parameters `phase` gives a gradient to and updates."""
        return list(self.phase(phase)["used"])

    def unused(self, phase: str) -> list[str]:
        return list(self.phase(phase)["unused"])

    def buckets(self, phase: str) -> list[list[str]]:
        """The phase's buckets, each a list of parameter names, in all-reduce order."""
        return [[s["parameter"] for s in b["slots"]] for b in self.phase(phase)["buckets"]]

    def bytes_per_step(self, phase: str) -> int:
        """Bytes the phase all-reduces per step."""
        return sum(b["bytes"] for b in self.phase(phase)["buckets"])

    def explain(self) -> str:
        """What `ganc explain` prints."""
        return _run(["explain", self.path], echo=False)

    def _repr_pretty_(self, printer, cycle):  # IPython
        printer.text(self.explain())


def _key(phase: dict) -> str:
    return phase["name"] + (f"@{phase['stage']}" if phase.get("stage") else "")


def compile(archive: str, output: str | None = None, *, bucket_cap_mb: float | str | None = None,
            first_bucket_mb: float | None = None, zero: int | None = None,
            ranks: int | None = None, target_gpus: int | None = None, profile: str | None = None,
            link: str | None = None, op_libraries=()) -> Plan:
    """`ganc compile ARCHIVE -o OUTPUT` (default: the archive's name with .plan). `zero` (0,
    1, 2) shards optimizer state instead of the spec's stage; `ranks` lays the shards out
    for that many ranks. `bucket_cap_mb="auto"` picks each phase's caps for `target_gpus`
    ranks from a `train(..., profile=PATH)` run's `profile` (between hosts on `link`).
    `op_libraries`: the operator libraries the archive was exported with."""
    output = output or os.path.splitext(archive)[0] + ".plan"
    args = ["compile", archive, "-o", output, "--emit", "json"]
    flags = {"--bucket-cap-mb": bucket_cap_mb, "--first-bucket-mb": first_bucket_mb, "--zero": zero,
             "--ranks": ranks, "--target-gpus": target_gpus, "--profile": profile, "--link": link}
    for flag, value in flags.items():
        if value is not None:
            args += [flag, str(value)]
    for library in op_libraries:  # one flag each: a path may hold a comma
        args += ["--op-library", str(library)]
    return Plan(output, archive, json.loads(_run(args, echo=False)))


def simulate(plan: Plan | str, profile: str, gpus=(1, 8, 64, 512, 1024), **options) -> list[dict]:
    """`ganc simulate`: per world size in `gpus`, the predicted step_seconds, exposed_seconds
    and efficiency, and the same for StyleGAN3's flat all-reduce (flat_step_seconds, ...),
    from a `train(..., profile=PATH)` run of the plan. Other keywords are `ganc simulate`
    options: link="ethernet", intra_link="nvlink", ranks_per_host=8, alpha_us=..., ..."""
    path = plan.path if isinstance(plan, Plan) else plan
    if isinstance(gpus, int):
        gpus = [gpus]
    if isinstance(gpus, str) or not all(isinstance(n, int) for n in gpus):
        raise TypeError(f"ganc.simulate: gpus= takes world sizes, an int or a list of ints like [1, 8, 64], "
                        f"not {gpus!r}")  # "64" would be read as 6 and 4
    args = ["simulate", path, "--profile", str(profile), "--gpus", ",".join(str(n) for n in gpus), "--json"]
    return json.loads(_run(args + _option_args(options), echo=False))


# Options given as booleans that the driver spells on/off.
# `ganc train`'s options and their values (generated from its option table).
_TRAIN_OPTIONS = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "train_options.json")))["train"]


def _option_args(options: dict, table: dict | None = None) -> list[str]:
    """Keyword arguments as command-line options: a flag takes True (False leaves it out), an
    on|off option takes a bool, a KEY=VALUE option a dict. With `table` (ganc train's options
    and their values), an unknown keyword, or a bool for an option that takes another value,
    is a TypeError naming it."""
    args = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if table is not None and (flag not in table or flag in ("--model", "--data", "--out")):
            raise TypeError(f"ganc.train: unknown option {key}= (the keywords are ganc train's options; "
                            "see ganc train --help)")
        takes = table[flag] if table is not None else ""
        if value is None or (value is False and not takes):
            continue
        if isinstance(value, bool):
            if not takes:
                args += [flag]
            elif {"on", "off"} <= set(takes.split("|")):
                args += [flag, "on" if value else "off"]
            else:
                raise TypeError(f"ganc.train: {key}= takes {takes}, not {value}")
        elif isinstance(value, dict):  # accumulate={"Dmain": 2}, clip={"G": (1.0, "inf")}
            for k, v in value.items():
                text = ",".join(str(x) for x in v) if isinstance(v, (list, tuple)) else str(v)
                args += [flag, f"{k}={text}"]
        elif isinstance(value, (list, tuple)) and flag == "--op-library":
            for v in value:  # one flag each: a path may hold a comma
                args += [flag, str(v)]
        elif isinstance(value, (list, tuple)):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            args += [flag, str(value)]
    return args


def train(plan: Plan | str, model: str | None = None, data=None, *, nproc: int = 1,
          out: str = "ganc-out", quiet: bool = False, **options) -> dict:
    """Trains with `nproc` local ranks (`ganc run`) and returns the run's summary (what
    OUT/summary.json holds: steps, wall time, img/s, the last logged losses, skipped steps,
    the files written).

    `data` is a path (tensor file, image folder, zip), a tensor [N, *shape] in [-1, 1], or
    {"images": tensor, "labels": int64 tensor [N]} for conditional models.
    Every other keyword is a `ganc train` option: steps=2000, seed=1, log_every=100,
    resume="auto", force=True, lr=2e-4, betas=(0.0, 0.99), zero=2, device="cuda",
    cuda_graphs=False (or "step"), and the recipe, set in the plan at start-up without a new
    export (the run directory keeps the plan it trained, OUT/plan.ganc): precision="bfloat16" (or {"Dmain": "float16"}), accumulate={"Dmain": 2},
    clip={"generator": (1.0, 2)}, non_finite="skip", ema_half_life_images=10000, ...
    `quiet` stops the progress lines being echoed.
    `op_libraries=[path, ...]`: the operator libraries the archive was exported with.
    """
    if "op_libraries" in options:
        options["op_library"] = list(options.pop("op_libraries")) or None
    extra = _option_args(options, _TRAIN_OPTIONS)  # an unknown keyword is refused before anything runs
    if isinstance(plan, str):
        plan = Plan(plan, model, {})
    model = model or plan.model
    if model is None:
        raise ValueError("ganc.train: say which archive the plan was compiled from (model=...)")
    with tempfile.TemporaryDirectory(prefix="ganc-data-") as tmp:
        if data is not None and not isinstance(data, (str, os.PathLike)):
            import torch
            path = os.path.join(tmp, "data.pt")
            if isinstance(data, torch.Tensor):
                if data.dim() == 0 or data.is_complex():
                    raise TypeError("ganc.train: data= takes a real tensor [N, *shape] of samples, not a "
                                    + ("complex tensor" if data.is_complex() else "0-d tensor"))
                torch.save(data.detach().cpu().contiguous(), path)
            elif isinstance(data, dict) and isinstance(data.get("images"), torch.Tensor) and all(
                    isinstance(v, torch.Tensor) for v in data.values()):
                torch.save({k: v.detach().cpu().contiguous() for k, v in data.items()}, path)
            else:
                raise TypeError("ganc.train: data= takes a path (tensor file, image folder or zip), a tensor "
                                "[N, *shape] or {'images': tensor, 'labels': tensor}, not "
                                f"{type(data).__name__}")
            data = path
        args = ["run", "--nproc", str(nproc), plan.path, "--model", str(model), "--out", str(out)]
        if data is not None:
            args += ["--data", str(data)]
        _run(args + extra, echo=not quiet)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)
