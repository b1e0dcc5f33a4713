"""The reference's ranks: spawned, joined into a process group as ganc's ranks are,
trained for the given steps; rank 0 writes the gradients and final state."""
from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..exporter import load_spec
from ..spec import fade_at, stage_at
from .inputs import load_data, rank_inputs
from .recipe import cuda_determinism, eager_twin, to_channels_last
from .training import EagerTraining


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _worker(rank, world, port, archive, data_path, steps, seed, out_dir, device, reducer,
            deterministic=False, benchmark=True, channels_last=False, global_batch_of=0, zero=False,
            shared_gpu=False, eager_model=None, op_libraries=()):
    cuda, gpu = _start_rank(rank, world, port, device, shared_gpu, deterministic, benchmark, op_libraries)
    files = {"ganc.json": ""}
    gan = torch.jit.load(archive, _extra_files=files)
    spec = json.loads(files["ganc.json"])
    if eager_model is not None:
        gan = eager_twin(gan, eager_model(), spec)
    if cuda:
        gan = gan.to(f"cuda:{gpu}")
    if channels_last:
        channels_last = to_channels_last(gan)
    gan.train()
    data, labels = load_data(data_path, spec)
    inputs = rank_inputs(spec, data, labels, rank, world, seed, cuda, gpu, global_batch_of, channels_last)
    training = EagerTraining(gan, spec, world, cuda, gpu, reducer, zero)
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
        images = len(batches) * spec["batch_size"] * world
        training.controllers.end_step(step + 1, images)
        training.end_step(images)
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
