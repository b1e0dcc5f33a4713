"""`ganc stylegan`: a StyleGAN2(-ADA) run in one command, shaped like NVIDIA's train.py.

    ganc stylegan --outdir runs --data ffhq256.zip --gpus 8 --cfg paper256 --mirror 1 \\
        --networks ~/stylegan2-ada-pytorch

builds the networks of `--networks` (a checkout of NVIDIA's stylegan2-ada-pytorch or stylegan3
repository, used in place and never copied, or a module or .py file with NVIDIA's Generator and
Discriminator signatures) with train.py's preset sizes, wraps them in `ganc.recipes.stylegan2`
(StyleGAN2Loss, the preset's optimizers, G_ema, ADA), exports and compiles them into a new run
directory `OUTDIR/NNNNN-DESC` named as train.py names it, and trains with `ganc run`: a tick
line every `--tick` kimg, a sample grid and a checkpoint every `--snap` ticks, each checkpoint
also written as `network-snapshot-KIMG.pkl` (G, D, G_ema, augment_pipe, training_set_kwargs),
the file NVIDIA's generate.py, calc_metrics.py and legacy.load_network_pkl read. `--resume PKL`
starts from a network pickle's weights as train.py does; `--resume RUN_DIR` continues an
interrupted run exactly (ganc's checkpoint: optimizer state, ADA's p, the data order).
"""
from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import pickle
import re
import sys
import threading
import zipfile

__all__ = ["main"]

AUGPIPES = ("blit", "geom", "color", "filter", "noise", "cutout", "bg", "bgc", "bgcf", "bgcfn", "bgcfnc")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
OPTIONS_FILE = "training_options.json"


class UserError(Exception):
    """A bad option or input, said in one line before anything is written."""


def _bool(text: str) -> bool:
    """train.py's BOOL options (click's bool): 1/0, true/false, yes/no, on/off."""
    value = text.strip().lower()
    if value in ("1", "true", "t", "yes", "y", "on"):
        return True
    if value in ("0", "false", "f", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a valid boolean")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ganc stylegan", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--outdir", help="where the run directory NNNNN-DESC is made (train.py's --outdir)")
    a("--data", help="the training images: a zip or folder (dataset_tool.py's format)")
    a("--networks", help="NVIDIA's stylegan2-ada-pytorch or stylegan3 checkout, or a module or .py file with "
                         "Generator and Discriminator (required unless --resume names a run directory)")
    a("--gpus", type=int, default=1, help="ranks, one per GPU (CPU ranks with --device cpu) [default: 1]")
    a("--device", choices=("auto", "cuda", "cpu"), default="auto", help="[default: auto, CUDA where present]")
    a("--cfg", choices=("auto", "stylegan2", "paper256", "paper512", "paper1024", "cifar"), default="auto",
      help="train.py's base config [default: auto]")
    a("--batch", type=int, help="override the batch over every GPU")
    a("--batch-gpu", type=int, help="images per GPU and pass (stylegan3's --batch-gpu) [default: batch // gpus]")
    a("--gamma", type=float, help="override R1 gamma")
    a("--kimg", type=int, help="override the training length in thousands of images")
    a("--tick", type=float, default=4, help="progress line interval in kimg [default: 4]")
    a("--snap", type=int, default=50, help="snapshot interval in ticks [default: 50]")
    a("--metrics", default="fid50k_full", help='comma-separated list or "none" [default: fid50k_full]')
    a("--inception", help="the feature network of --metrics (ganc run's --inception) [default: $GANC_INCEPTION, "
                           "else ~/.cache/ganc/inception-2015-12-05.pt]")
    a("--seed", type=int, default=0, help="random seed [default: 0]")
    a("--mirror", type=_bool, default=False, help="enable x-flips of the data set [default: false]")
    a("--cond", type=_bool, default=False, help="condition on the data set's labels [default: false]")
    a("--aug", choices=("noaug", "ada", "fixed"), help="augmentation mode [default: ada]")
    a("--p", type=float, help="augmentation probability for --aug fixed")
    a("--target", type=float, help="ADA target value for --aug ada [default: 0.6]")
    a("--augpipe", choices=AUGPIPES, help="augmentation pipeline [default: bgc]")
    a("--resume", help="a network pickle to start from (train.py's), or a run directory to continue exactly")
    a("--fp32", type=_bool, default=False, help="disable mixed precision [default: false]")
    a("--cbase", type=int, help="channel base (stylegan3's --cbase) [default: the config's]")
    a("--cmax", type=int, default=512, help="most channels per layer [default: 512]")
    a("--map-depth", type=int, help="mapping network depth [default: the config's]")
    a("--mbstd-group", type=int, help="minibatch standard deviation group [default: the config's]")
    a("-n", "--dry-run", action="store_true", help="print the run's options and exit")
    return p


# --- the networks -----------------------------------------------------------------------------

def load_networks(where: str):
    """(Generator, Discriminator, NVIDIA's AugmentPipe or None, a description) from a checkout of
    NVIDIA's repository (its root goes on sys.path, as their scripts run), a .py file (its folder
    goes on sys.path) or a module name."""
    path = os.path.abspath(os.path.expanduser(where))
    pipe_module = None
    if os.path.isdir(path):
        training = os.path.join(path, "training")
        name = next((m for m in ("networks", "networks_stylegan2")
                     if os.path.isfile(os.path.join(training, m + ".py"))), None)
        if name is None:
            raise UserError(f"--networks {where}: no training/networks.py or training/networks_stylegan2.py "
                            "(a checkout of NVIDIA's stylegan2-ada-pytorch or stylegan3 repository)")
        sys.path.insert(0, path)
        module_name = f"training.{name}"
        if os.path.isfile(os.path.join(training, "augment.py")):
            pipe_module = "training.augment"
    elif path.endswith(".py") and os.path.isfile(path):
        sys.path.insert(0, os.path.dirname(path))
        module_name = os.path.splitext(os.path.basename(path))[0]
    else:
        module_name = where
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # their code's own import errors too (a missing package)
        raise UserError(f"--networks {where}: importing {module_name} failed: {type(e).__name__}: {e}") from None
    missing = [c for c in ("Generator", "Discriminator") if not hasattr(module, c)]
    if missing:
        raise UserError(f"--networks {where}: {module_name} has no {' or '.join(missing)}")
    pipe = None
    if pipe_module is not None:
        try:
            pipe = importlib.import_module(pipe_module).AugmentPipe
        except Exception as e:
            raise UserError(f"--networks {where}: importing {pipe_module} failed: {type(e).__name__}: {e}") from None
    return module.Generator, module.Discriminator, pipe, module_name


# --- the data set -------------------------------------------------------------------------------

def read_dataset(path: str, cond: bool) -> dict:
    """What train.py reads from the data set before training: its name, size, resolution,
    channels and (with --cond) its number of classes; a data set it would refuse is refused."""
    from PIL import Image
    if not os.path.exists(path):
        raise UserError(f"--data {path}: no such file or folder")
    if os.path.isdir(path):
        names = sorted(os.path.relpath(os.path.join(root, f), path) for root, _, files in os.walk(path)
                       for f in files)
        opener = lambda name: open(os.path.join(path, name), "rb")  # noqa: E731
    elif zipfile.is_zipfile(path):
        z = zipfile.ZipFile(path)
        names = sorted(z.namelist())
        opener = z.open
    else:
        raise UserError(f"--data {path}: neither a folder nor a zip archive")
    images = [n for n in names if n.lower().endswith(IMAGE_EXTENSIONS)]
    if not images:
        raise UserError(f"--data {path}: no images ({', '.join(IMAGE_EXTENSIONS)})")
    with opener(images[0]) as f:
        first = Image.open(f)
        first.load()
    width, height = first.size
    if width != height or width < 4 or width & (width - 1):
        raise UserError(f"--data {path}: {images[0]} is {width}x{height}; StyleGAN's images are square with a "
                        "power-of-two side (dataset_tool.py --resolution)")
    classes = 0
    if cond:
        labels = None
        if "dataset.json" in names:
            with opener("dataset.json") as f:
                labels = json.load(f).get("labels")
        if not labels:
            raise UserError(f"--data {path}: --cond 1 needs the labels of a dataset.json (dataset_tool.py)")
        classes = max(int(label) for _, label in labels) + 1
    name = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    return {"name": name, "images": len(images), "resolution": width,
            "channels": 1 if first.mode in ("L", "I", "I;16") else 3, "classes": classes}


# --- the run --------------------------------------------------------------------------------

def describe(args, data: dict) -> str:
    """train.py's run description (setup_training_loop_kwargs' desc)."""
    desc = data["name"] + ("-cond" if args.cond else "") + ("-mirror" if args.mirror else "") + f"-{args.cfg}"
    if args.cfg == "auto":
        desc += f"{args.gpus:d}"
    desc += f"-gamma{args.gamma:g}" if args.gamma is not None else ""
    desc += f"-kimg{args.kimg:d}" if args.kimg is not None else ""
    desc += f"-batch{args.batch}" if args.batch is not None else ""
    desc += f"-{args.aug}" if args.aug is not None else ""
    desc += f"-p{args.p:g}" if args.p is not None else ""
    desc += f"-target{args.target:g}" if args.target is not None else ""
    desc += f"-{args.augpipe}" if args.augpipe is not None else ""
    if args.resume is not None:
        desc += "-resumecustom"
    return desc


def new_run_dir(outdir: str, desc: str) -> str:
    """OUTDIR/NNNNN-DESC, NNNNN one past the largest run id there (train.py's numbering)."""
    ids = [int(m.group()) for x in (os.listdir(outdir) if os.path.isdir(outdir) else [])
           if os.path.isdir(os.path.join(outdir, x)) and (m := re.match(r"^\d+", x))]
    return os.path.join(outdir, f"{max(ids, default=-1) + 1:05d}-{desc}")


def check(args) -> None:
    """train.py's checks of its options, each refused in one line."""
    if args.gpus < 1:
        raise UserError("--gpus must be at least 1")
    if args.kimg is not None and args.kimg < 1:
        raise UserError("--kimg must be at least 1")
    if args.gamma is not None and not args.gamma >= 0:
        raise UserError("--gamma must be non-negative")
    if args.batch is not None and not (args.batch >= 1 and args.batch % args.gpus == 0):
        raise UserError("--batch must be at least 1 and divisible by --gpus")
    aug = args.aug or "ada"
    if aug == "fixed" and args.p is None:
        raise UserError("--aug=fixed requires specifying --p")
    if args.p is not None and (aug != "fixed" or not 0 <= args.p <= 1):
        raise UserError("--p can only be specified with --aug=fixed, between 0 and 1")
    if args.target is not None and (aug != "ada" or not 0 <= args.target <= 1):
        raise UserError("--target can only be specified with --aug=ada, between 0 and 1")
    if args.augpipe is not None and aug == "noaug":
        raise UserError("--augpipe cannot be specified with --aug=noaug")
    if args.tick <= 0 or args.snap < 1:
        raise UserError("--tick must be above 0 and --snap at least 1")
    if [m for m in args.metrics.split(",") if m and m != "none"]:
        inception = args.inception or os.environ.get("GANC_INCEPTION") or os.path.expanduser(
            "~/.cache/ganc/inception-2015-12-05.pt")
        if not os.path.isfile(inception):
            raise UserError(f"--metrics {args.metrics}: the Inception network {inception} is missing (NVIDIA's "
                            "inception-2015-12-05.pt; --inception PATH), or --metrics none")


def build(args, data: dict, Generator, Discriminator, NvidiaPipe):
    """(the GAN, its spec, G, D, the pipe to pickle, training_set_kwargs): train.py's networks,
    loss and options for these arguments."""
    import torch

    from . import recipes
    overrides = {k: v for k, v in (("gamma", args.gamma), ("kimg", args.kimg), ("batch", args.batch),
                                   ("map", args.map_depth), ("mbstd", args.mbstd_group)) if v is not None}
    if args.cbase is not None:
        overrides["fmaps"] = args.cbase / 32768
    try:
        p = recipes.preset(args.cfg, data["resolution"], args.gpus, **overrides)
    except ValueError as e:
        raise UserError(str(e).replace("ganc.recipes: ", "")) from None
    nets = p.network_kwargs()
    for kw in (nets["G"]["synthesis_kwargs"], nets["D"]):
        kw["channel_max"] = args.cmax
        if args.fp32:
            kw["num_fp16_res"], kw["conv_clamp"] = 0, None
    common = dict(c_dim=data["classes"], img_resolution=data["resolution"], img_channels=data["channels"])
    torch.manual_seed(args.seed)
    try:
        G = Generator(**nets["G"], **common)
        D = Discriminator(**nets["D"], **common)
    except TypeError as e:
        raise UserError(f"--networks: {e} (train.py's sizes: G {nets['G']}, D {nets['D']})") from None
    G_ema = copy.deepcopy(G).eval()
    if args.resume is not None:
        resume_from_pickle(args.resume, {"G": G, "D": D, "G_ema": G_ema})
    aug = args.aug or "ada"
    augpipe = args.augpipe or "bgc"
    pipe = None
    kwargs = {}
    if aug != "noaug":
        from . import augment as pipes
        pipe = NvidiaPipe(**pipes.PIPES[augpipe]) if NvidiaPipe is not None else augpipe
        kwargs = dict(augment=pipe, augment_p=args.p or 0.0,
                      ada_target=(0.6 if args.target is None else args.target) if aug == "ada" else None)
    try:
        gan, spec = recipes.stylegan2(G, D, cfg=args.cfg, gpus=args.gpus, G_ema=G_ema, batch_gpu=args.batch_gpu,
                                      **kwargs, **overrides)
    except ValueError as e:
        raise UserError(str(e).replace("ganc.recipes: ", "")) from None
    if args.mirror:
        spec["data"]["xflip"] = True
    training_set_kwargs = {"class_name": "training.dataset.ImageFolderDataset", "path": args.data,
                           "use_labels": bool(args.cond), "max_size": data["images"], "xflip": bool(args.mirror),
                           "resolution": data["resolution"]}
    return gan, spec, p, G, D, pipe if not isinstance(pipe, str) else gan.augment_pipe, training_set_kwargs


def resume_from_pickle(path: str, networks: dict) -> None:
    """train.py's --resume: each network takes the pickle's parameters and buffers by name
    (copy_params_and_buffers, not all required); the optimizers start afresh."""
    import torch
    if not os.path.isfile(path):
        raise UserError(f"--resume {path}: no such network pickle or run directory")
    try:
        with open(path, "rb") as f:
            try:
                import legacy  # their loader, where --networks put their checkout on sys.path
                source = legacy.load_network_pkl(f)
            except ImportError:
                source = pickle.load(f)
    except Exception as e:
        raise UserError(f"--resume {path}: not a network pickle: {type(e).__name__}: {e}") from None
    for name, module in networks.items():
        theirs = source.get(name) if isinstance(source, dict) else None
        if theirs is None:
            continue
        tensors = dict(theirs.named_parameters()) | dict(theirs.named_buffers())
        with torch.no_grad():
            for key, value in list(module.named_parameters()) + list(module.named_buffers()):
                if key in tensors and tensors[key].shape == value.shape:
                    value.copy_(tensors[key].detach())


class Snapshots:
    """Writes `network-snapshot-KIMG.pkl` for each step checkpoint `ganc run` writes in the run
    directory, while it trains (a thread polling the directory) and once more at its end."""

    def __init__(self, run_dir: str, networks: dict, training_set_kwargs: dict):
        self.run_dir, self.networks, self.training_set_kwargs = run_dir, networks, training_set_kwargs
        self.done: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    @staticmethod
    def step_checkpoints(run_dir: str) -> list[str]:
        return sorted(n for n in os.listdir(run_dir) if re.fullmatch(r"checkpoint-\d+\.pt", n))

    def convert_new(self) -> None:
        from .snapshots import stylegan_snapshot
        for name in self.step_checkpoints(self.run_dir):
            if name in self.done:
                continue
            try:
                path = stylegan_snapshot(os.path.join(self.run_dir, name), self.run_dir, self.training_set_kwargs,
                                         **self.networks)
            except FileNotFoundError:  # rotated away meanwhile (--keep-checkpoints)
                path = None
            self.done.add(name)
            if path:
                print(f"ganc stylegan: wrote {path}", flush=True)

    def _poll(self) -> None:
        while not self.stop.wait(2.0):
            self.convert_new()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        if exc[0] is None:
            self.convert_new()


def run_options(args, device: str) -> dict:
    """ganc run's options for these arguments."""
    options = dict(tick_kimg=args.tick, snap=args.snap, seed=args.seed, device=device, keep_checkpoints=3)
    if args.kimg is not None:
        options["kimg"] = args.kimg
    metrics = [m for m in args.metrics.split(",") if m and m != "none"]
    if metrics:  # train.py scores each snapshot
        options["metrics"] = ",".join(metrics)
        options["metrics_every"] = args.tick * args.snap
        if args.inception:
            options["inception"] = args.inception
    return options


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.command = "ganc stylegan " + " ".join(argv)
    try:
        return _main(args)
    except UserError as e:
        print(f"ganc stylegan: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # ganc run has checkpointed the step it was in and stopped
        print("ganc stylegan: interrupted; continue the run exactly with --resume RUN_DIR", file=sys.stderr)
        return 130


def _main(args) -> int:
    import torch

    import ganc
    from .api import GancError
    if args.resume is not None and os.path.isdir(args.resume):
        defaults = parser().parse_args([])
        given = [k for k, v in vars(args).items() if k not in ("resume", "command") and v != getattr(defaults, k)]
        if given:
            raise UserError(f"--resume {args.resume}: a run directory continues with the options it started with; "
                            f"drop --{given[0].replace('_', '-')}")
        return _continue(args.resume)
    for name in ("outdir", "data"):
        if getattr(args, name) is None:
            raise UserError(f"--{name} is required (or --resume RUN_DIR to continue a run)")
    if args.networks is None:
        raise UserError("--networks: name NVIDIA's stylegan2-ada-pytorch or stylegan3 checkout, or a module "
                        "or .py file with Generator and Discriminator")
    check(args)
    data = read_dataset(args.data, args.cond)
    Generator, Discriminator, NvidiaPipe, module = load_networks(args.networks)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cpu" and not args.fp32:
        args.fp32 = True
        print("ganc stylegan: on the CPU the float16 layers train in float32 (--fp32 1)", flush=True)
    gan, spec, p, G, D, pipe, training_set_kwargs = build(args, data, Generator, Discriminator, NvidiaPipe)
    run_dir = new_run_dir(args.outdir, describe(args, data))
    options = run_options(args, device)
    kimg = args.kimg if args.kimg is not None else p.kimg
    options.setdefault("kimg", kimg)
    record = {"command": args.command, "args": vars(args), "networks": module, "data": data, "run_options": options,
              "training_set_kwargs": training_set_kwargs, "spec": spec}
    print(f"Output directory:   {run_dir}\nNetworks:           {module}\nTraining data:      {args.data}\n"
          f"Training duration:  {kimg} kimg\nNumber of GPUs:     {args.gpus} ({device})\n"
          f"Number of images:   {data['images']}\nImage resolution:   {data['resolution']}\n"
          f"Conditional model:  {bool(args.cond)}\nDataset x-flips:    {bool(args.mirror)}\n"
          f"Batch:              {spec['batch_size']} per GPU x {args.gpus} GPUs"
          f"{' x ' + str(spec['phases'][0]['accumulate']) + ' rounds' if 'accumulate' in spec['phases'][0] else ''}",
          flush=True)
    if args.dry_run:
        print(json.dumps(record, indent=2, default=str))
        print("Dry run; exiting.")
        return 0
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, OPTIONS_FILE), "w") as f:
        json.dump(record, f, indent=2, default=str)
    archive = os.path.join(run_dir, "model.pt")
    ganc.export(gan, archive, spec)
    try:
        plan = ganc.compile(archive, os.path.join(run_dir, "model.plan"))
    except GancError as e:
        print(f"ganc stylegan: error: {e}", file=sys.stderr)
        return 1
    return _train(run_dir, plan, args, (G, D, pipe), training_set_kwargs, options)


def _train(run_dir: str, plan, args, nets: tuple, training_set_kwargs: dict, options: dict,
           resume: bool = False) -> int:
    """`ganc run` in `run_dir`, each new step checkpoint pickled as it lands (`nets`: G, D and
    the pipe, fresh instances of the user's classes); `resume` continues from the checkpoint."""
    import ganc
    from .api import GancError
    G, D, pipe = nets
    networks = {"G": G, "D": D, "G_ema": copy.deepcopy(G)}
    if pipe is not None:
        networks["augment_pipe"] = pipe
    snapshots = Snapshots(run_dir, networks, training_set_kwargs)
    if resume:  # the pickles of the checkpoints already there were written
        snapshots.done |= set(Snapshots.step_checkpoints(run_dir))
    try:
        with snapshots:
            ganc.train(plan, os.path.join(run_dir, "model.pt"), args.data, nproc=args.gpus, out=run_dir,
                       **(dict(resume="auto") if resume else {}), **options)
    except GancError as e:
        print(f"ganc stylegan: error: {e}", file=sys.stderr)
        return 1
    return 0


def _continue(run_dir: str) -> int:
    """--resume RUN_DIR: the run goes on from its checkpoint exactly, with its own options."""
    try:
        with open(os.path.join(run_dir, OPTIONS_FILE)) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"--resume {run_dir}: not a run directory of ganc stylegan ({OPTIONS_FILE}: {e})") from None
    args = argparse.Namespace(**{**record["args"], "resume": None})
    Generator, Discriminator, NvidiaPipe, _ = load_networks(args.networks)
    data = read_dataset(args.data, args.cond)
    _, _, _, G, D, pipe, training_set_kwargs = build(args, data, Generator, Discriminator, NvidiaPipe)
    print(f"ganc stylegan: continuing {run_dir} from its checkpoint", flush=True)
    return _train(run_dir, os.path.join(run_dir, "model.plan"), args, (G, D, pipe), training_set_kwargs,
                  record["run_options"], resume=True)


if __name__ == "__main__":
    sys.exit(main())
