"""The joint graph: each phase captured as one list of ATen ops (its forward, its autograd.grad
calls with create_graph, its parameter gradients), written as ganc's op list and run by `ganc
joint` through the dispatcher, with no autograd engine and no TorchScript. Against eager
PyTorch in the same test: the loss, every parameter gradient and every buffer after the phase
bit for bit; the parameters with a gradient equal to the plan's used set (the analysis of the
TorchScript door)."""
import copy
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import ganc
import zoo
from conftest import archive
from ganc import joint
from ganc.phases import example_inputs, phase_loss

# Zoo models with no random op inside their phases (the capture records torch's draws; ganc's
# generator does not feed them yet): an MLP, convolutions with batch norm, WGAN-GP's and R1's
# double backward, spectral norm's power iteration (a buffer updated in place), BigGAN's class
# conditioning and StyleGAN2's path length and R1.
MODELS = ["mlp", "dcgan32", "wgan_gp", "r1gan", "sngan", "biggan32", "stylegan2"]


def eager(gan, phase, args):
    """The phase in eager PyTorch: its loss, the gradients of the parameters it updates (None
    where none flows) and its buffers after it."""
    model = copy.deepcopy(gan)
    loss = phase_loss(getattr(model, phase["method"])(*args), phase)
    names = [n for n, _ in model.named_parameters()
             if any(n == o or n.startswith(o + ".") for o in phase["updates"])]
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    return loss.detach(), dict(zip(names, grads)), {n: b.detach() for n, b in model.named_buffers()}


def plan_used(ganc_bin, model, tmp_path) -> dict:
    """Each phase's used parameters in the plan of the test archive `model` (or of the archive
    at that path)."""
    path = model if os.path.exists(model) else archive(model)
    plan = str(tmp_path / (os.path.basename(path) + ".plan"))
    subprocess.run([ganc_bin, "compile", path, "-o", plan], check=True, capture_output=True)
    r = subprocess.run([ganc_bin, "explain", plan, "--json"], check=True, capture_output=True, text=True)
    return {(p["name"], p["stage"]) if p.get("stage") else p["name"]: sorted(p["used"])
            for p in json.loads(r.stdout)["phases"]}


def stages_of(gan, spec):
    """(stage name or None, a function that sets the gan to it) for each stage of the spec."""
    if "stages" not in spec:
        return [(None, lambda: None)]

    def setter(k):
        def set_stage():
            for path in spec["stages"]["attributes"]:
                owner, _, attribute = path.rpartition(".")
                setattr(gan.get_submodule(owner) if owner else gan, attribute, k)
        return set_stage
    return [(stage["name"], setter(k)) for k, stage in enumerate(spec["stages"]["list"])]


@pytest.mark.parametrize("model", MODELS)
def test_a_captured_phase_runs_through_the_dispatcher_as_eager_computes_it(ganc_bin, model, tmp_path):
    torch.manual_seed(0)
    gan, spec = zoo.build(model)
    gan.train()
    used = plan_used(ganc_bin, model, tmp_path)
    for phase in spec["phases"]:
        args = example_inputs(spec, phase, 4)
        graph = joint.capture(gan, phase, args)
        path, inputs, out = (str(tmp_path / f"{phase['name']}.{kind}.pt") for kind in ("joint", "inputs", "out"))
        joint.to_file(graph, path)
        tensors = {n: p.detach() for n, p in gan.named_parameters()}
        tensors.update({n: b.detach().clone() for n, b in gan.named_buffers()})
        tensors.update({inp["name"]: a for inp, a in zip(phase["inputs"], args)})
        torch.save(tensors, inputs)
        r = subprocess.run([ganc_bin, "joint", path, "--inputs", inputs, "-o", out], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert f"phase {phase['name']} ({phase['method']}): {len(joint.op_list(graph)['nodes'])} ATen ops" in r.stdout

        loss, grads, buffers = eager(gan, phase, args)
        got = ganc.load_checkpoint(out)
        assert torch.equal(got["loss"], loss), (phase["name"], got["loss"], loss)
        assert sorted(graph.used) == sorted(n for n, g in grads.items() if g is not None)
        assert sorted(graph.used) == used[phase["name"]], phase["name"]
        for name in graph.used:
            assert torch.equal(got[f"gradient:{name}"], grads[name]), (phase["name"], name)
        for name, value in buffers.items():
            assert torch.equal(got[f"buffer:{name}"], value), (phase["name"], name)


@pytest.mark.parametrize("model", sorted(set(zoo.ZOO) - set(MODELS) - {"mlp_branch"}))
def test_the_used_parameters_read_off_the_graph_equal_the_plans(ganc_bin, model, tmp_path):
    """Every other zoo model (random ops, stages, frozen layers, AMP, EMA): the parameters whose
    gradient the joint graph computes are the plan's used set, phase by phase. Sections, and
    the phases that take their values, are not captured yet."""
    gan, spec = zoo.build(model)
    gan.train()
    used = plan_used(ganc_bin, model, tmp_path)
    compared = 0
    for stage, set_stage in stages_of(gan, spec):
        set_stage()
        for phase in spec["phases"]:
            if "updates" not in phase or any(i["source"] == "output" for i in phase["inputs"]):
                continue
            graph = joint.capture(gan, phase, example_inputs(spec, phase, 4))
            key = phase["name"] if stage is None else (phase["name"], stage)
            assert sorted(graph.used) == used[key], key
            compared += 1
    assert compared or model in ("cyclegan_pool", "pix2pix"), model


def test_a_branch_on_a_tensor_value_is_refused_naming_its_line(tmp_path):
    """The MLP GAN whose D picks its head by `if bool(x.mean() > 0.05)`: a joint graph holds one
    path, so the capture names the line (make_fx's own error was a paragraph about tracing
    tensors)."""
    gan, spec = zoo.build("mlp_branch")
    phase = spec["phases"][0]
    with pytest.raises(ganc.ExportError) as info:
        joint.capture(gan, phase, example_inputs(spec, phase, 4))
    message = str(info.value)
    assert "\n" not in message
    assert re.search(r"^ganc.joint: phase 'd' \(phase_d\): a Python value read from a tensor \(.*finetune\.py:\d+\) "
                     r"decides what runs", message), message


def test_a_graph_that_is_not_an_op_list_is_refused_in_one_line(ganc_bin, tmp_path):
    path = str(tmp_path / "x.pt")
    torch.save({"graph": json.dumps({"ganc_joint": 7})}, path)
    r = subprocess.run([ganc_bin, "joint", path], capture_output=True, text=True)
    assert r.returncode == 2 and "an op list of another version (this ganc reads ganc_joint 1)" in r.stderr, r.stderr
    torch.save({"weights": torch.zeros(1)}, path)
    r = subprocess.run([ganc_bin, "joint", path], capture_output=True, text=True)
    assert r.returncode == 2 and "not a ganc joint graph (no 'graph' op list)" in r.stderr, r.stderr


# Trained through the joint door on 2 ranks: an MLP, convolutions with batch norm (buffers
# updated in the phase), R1 every 4 steps (double backward, the manual reference, as in
# test_parity.py), spectral norm's power iteration (an in-place buffer update), and DCGAN-32
# in float32 with a dynamic loss scaler (2^10, growing every 2 steps) and D accumulating 2
# micro-batches: the graphs' seed is the scale over the micro-batches; PGGAN through its
# three stages with fade-ins (one graph per phase and stage, picked as the stage changes); and
# DCGAN-32 under bfloat16 autocast with a loss scaler shared by D and G, D accumulating 2
# micro-batches and G clipped (autocast's casts are ops of the graph, each parameter cast once
# as autocast's cache does in eager); and random ops inside the phases (dropout in D,
# DiffAugment), drawn in eager's order.
# The MLP GAN, DCGAN-32, lazy R1 and SNGAN train through the joint door in test_parity.py (the
# default door on the CPU), against eager DDP; here, what parity's zoo does not hold.
TRAINED = [("dcgan32_scaled_f32", "digits", "ddp"), ("pggan_quick", "digits", "ddp"),
           ("dcgan32_amp", "digits", "ddp"), ("dcgan32_augment", "digits", "ddp"),
           ("dcgan32_scaled_f16", "digits", "ddp")]


def build(model):
    """A zoo model, or DCGAN-32 with a dynamic loss scaler and D accumulating 2 micro-batches in
    float32 (`dcgan32_scaled_f32`) or under float16 autocast (`dcgan32_scaled_f16`, GradScaler's
    initial scale: 65536 overflows float16, so the first steps are skipped, as in eager)."""
    if not model.startswith("dcgan32_scaled_"):
        return zoo.build(model)
    from zoo.dcgan import training_step_spec
    precision = {"f32": "float32", "f16": "float16"}[model.rsplit("_", 1)[1]]
    spec = training_step_spec("dcgan32", 8, [3, 32, 32], [100, 1, 1], precision=precision, accumulate_d=2,
                              clip_g=None, loss_scaling=True)
    if precision == "float32":
        spec["loss_scalers"] = {"amp": {"init_scale": 2.0 ** 10, "growth_interval": 2}}
    return zoo.build("dcgan32")[0], spec


@pytest.mark.parametrize("model,dataset,reducer", TRAINED)
def test_training_through_the_joint_executor_equals_eager_ddp(ganc_bin, datasets, tmp_path, model, dataset,
                                                              reducer):
    """ganc.export(..., joint=True), then `ganc run --executor joint` on 2 ranks: each phase's
    joint graph run by ganc's executor (no autograd engine, no TorchScript interpreter), its
    gradients handed to the buckets as the ops completing them run. Every all-reduced gradient
    and every final parameter equal eager DDP's, run in this test, bit for bit, and the run
    equals the TorchScript executor's."""
    from test_parity import STEPS, SEED, compare_bitwise, run_ganc
    from ganc import reference
    torch.manual_seed(0)
    gan, spec = build(model)
    path = str(tmp_path / f"{model}.pt")
    ganc.export(gan, path, spec, joint=True, verbose=False)
    got = {}
    for executor in ("joint", "torchscript"):
        (tmp_path / executor).mkdir()
        got[executor] = run_ganc(ganc_bin, model, datasets[dataset], 2, str(tmp_path / executor), "--executor",
                                 executor, path=path)
    ref_dir = str(tmp_path / "ddp")
    reference.run(path, datasets[dataset], 2, STEPS, SEED, out_dir=ref_dir, reducer=reducer)
    compare_bitwise(path, got["joint"], ref_dir)
    joint_params, script_params = (ganc.load_checkpoint(os.path.join(got[e], "params_final.pt"))
                                   for e in ("joint", "torchscript"))
    assert all(torch.equal(joint_params[p], script_params[p]) for p in script_params)


def test_a_run_of_another_precision_or_batch_does_not_run_the_graph_captured_for_the_spec(ganc_bin, datasets,
                                                                                          tmp_path):
    """A joint graph holds the autocast casts and the batch it was captured with. A run that
    changes the precision (--precision) or the batch (--batch-size) takes TorchScript for the
    phase under --executor auto, saying why, and trains as the TorchScript door does; --executor
    joint refuses it in one line. (The joint door once ran the float32 graph of a run given
    --precision bfloat16: no autocast at all, and no word of it.)"""
    torch.manual_seed(0)
    gan, spec = zoo.build("mlp")
    model, plain = str(tmp_path / "mlp.pt"), str(tmp_path / "plain.pt")
    ganc.export(gan, model, spec, verbose=False)
    ganc.export(gan, plain, spec, joint=False, verbose=False)
    plans = {}
    for archive_ in (model, plain):
        plans[archive_] = archive_ + ".plan"
        subprocess.run([ganc_bin, "compile", archive_, "-o", plans[archive_]], check=True, capture_output=True)
    for change, says in ((["--precision", "bfloat16"], "captured under float32 autocast, and this run's is bfloat16"),
                         (["--batch-size", "16"], "captured for a batch of 64, and this run's is 16")):
        finals = {}
        for name, archive_, extra in (("auto", model, []), ("script", plain, []), ("joint", model, ["--executor", "joint"])):
            out = str(tmp_path / f"{name}{change[0]}")
            r = subprocess.run([ganc_bin, "train", plans[archive_], "--model", archive_, "--data", datasets["ring"], "--steps", "3",
                                "--out", out, "--sample-every", "0", "--checkpoint-every", "3", "--tensorboard", "off",
                                *change, *extra], capture_output=True, text=True, timeout=300)
            if name == "joint":
                assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
                assert f"--executor joint: phase 'd': its joint graph was {says}; export it again" in r.stderr, r.stderr
                continue
            assert r.returncode == 0, r.stderr
            if name == "auto":
                assert f"phase 'd': TorchScript and autograd: its joint graph was {says}" in r.stdout, r.stdout
                assert "phases: d (eager), g (eager)" in r.stdout, r.stdout
            finals[name] = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))
        for sub in ("generator", "discriminator"):
            assert all(torch.equal(t, finals["script"][sub][n]) for n, t in finals["auto"][sub].items()), sub


def joint_blocks(plan_text: str) -> dict[str, list[str]]:
    """Each phase's joint graph in a plan's text, as its op lines."""
    blocks = {}
    for m in re.finditer(r"\n  phase @(\w+) \{.*?\n    joint \{\n(.*?)\n    \}", plan_text, re.S):
        blocks[m.group(1)] = [line.strip() for line in m.group(2).splitlines()]
    return blocks


def test_the_plan_places_each_all_reduce_in_the_joint_graph(ganc_bin, tmp_path):
    """`ganc compile` of an archive with joint graphs keeps each phase's graph in the plan and
    places each bucket's all-reduce in it right after the op that makes one of the bucket's
    gradients (the last one made, not the end of the graph), in the order the runtime
    launches them; `ganc explain` says where each starts and how much of the graph is left
    to run beside it."""
    torch.manual_seed(0)
    gan, spec = zoo.build("dcgan32")
    path = str(tmp_path / "dcgan32.pt")
    ganc.export(gan, path, spec, joint=True, verbose=False)
    plan = str(tmp_path / "dcgan32.plan")
    subprocess.run([ganc_bin, "compile", path, "-o", plan, "--bucket-cap-mb", "0.5", "--first-bucket-mb", "0.1"],
                   check=True, capture_output=True)
    text = open(plan).read()
    blocks = joint_blocks(text)
    assert sorted(blocks) == ["d", "g"]
    explained = subprocess.run([ganc_bin, "explain", plan], check=True, capture_output=True, text=True).stdout
    for phase, ops in blocks.items():
        buckets = len(re.findall(r"\n    bucket #\d+ ", text[text.index(f"phase @{phase} {{"):].split("\n  phase @")[0]))
        assert buckets >= 3, (phase, buckets)
        computes = [i for i, op in enumerate(ops) if not re.match(r"(%\S+ = )?ganc\.(?!item)", op)]
        placed = [(i, op) for i, op in enumerate(ops) if op.startswith("ganc.all_reduce(")]
        assert sorted(int(re.search(r"bucket = (\d+)", op).group(1)) for _, op in placed) == list(range(buckets))
        for i, op in placed:
            operands = set(re.findall(r"%\w+", op[:op.index(")")]))
            made = next(ops[j] for j in range(i - 1, -1, -1) if j in computes)
            assert made.split(" = ")[0] in operands, (phase, made, op)  # right after its last gradient
        first = placed[0][0]
        assert first < computes[-1], (phase, "the first bucket waits for the whole graph")
        lines = re.findall(r"all-reduce of bucket #(\d+) starts after op (\d+) of (\d+) \((\S+), (%\w+)\): "
                           r"(\d+) ops? left to overlap it", explained.split(f"\nphase {phase}:")[1].split("\nphase ")[0])
        assert len(lines) == buckets
        for (bucket, after, total, op, value, left), (i, placed_op) in zip(lines, placed):
            assert f"bucket = {bucket}" in placed_op
            assert int(total) == len(computes) and int(left) == int(total) - int(after)
        assert int(lines[0][5]) > 0


def test_a_phase_runs_its_joint_graph_by_default_where_the_plan_holds_one(ganc_bin, datasets, tmp_path):
    """`ganc train` without --executor (auto) runs each phase whose plan holds a joint graph
    through ganc's executor, as --executor joint does (the same parameters, bit for bit), and
    the rest through TorchScript; the start line and `ganc explain` say which door each took."""
    torch.manual_seed(0)
    gan, spec = zoo.build("mlp")
    model, plan = str(tmp_path / "mlp.pt"), str(tmp_path / "mlp.plan")
    ganc.export(gan, model, spec, joint=True, verbose=False)
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    explained = subprocess.run([ganc_bin, "explain", plan], check=True, capture_output=True, text=True).stdout
    assert explained.count("door: its joint graph through ganc's executor on the CPU") == 2, explained
    finals = {}
    plain = str(tmp_path / "mlp_plain.pt")
    ganc.export(gan, plain, spec, joint=False, verbose=False)
    for name, plan_, model_, extra in (("auto", plan, model, []), ("joint", plan, model, ["--executor", "joint"]),
                                        ("script", None, plain, [])):
        if plan_ is None:
            plan_ = str(tmp_path / "script.plan")
            subprocess.run([ganc_bin, "compile", model_, "-o", plan_], check=True, capture_output=True)
        out = str(tmp_path / name)
        r = subprocess.run([ganc_bin, "train", plan_, "--model", model_, "--data", datasets["ring"], "--steps", "3",
                            "--out", out, "--sample-every", "0", "--checkpoint-every", "3", *extra],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        door = "joint graph, ganc's executor" if name != "script" else "eager"
        assert f"phases: d ({door}), g ({door})" in r.stdout, r.stdout
        finals[name] = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))
    for sub in ("generator", "discriminator"):
        assert finals["auto"][sub] and all(torch.equal(t, finals["joint"][sub][n])
                                           for n, t in finals["auto"][sub].items()), sub


@pytest.mark.parametrize("zero", [1, 2])
def test_sharded_optimizer_state_through_the_joint_door_equals_the_torchscript_door(ganc_bin, datasets, tmp_path,
                                                                                     zero):
    """ZeRO 1 and 2 (buckets reduce-scattered, each rank stepping its shard) with DCGAN-32's
    joint graphs on 2 ranks: the plan places ganc.reduce_scatter (ZeRO 2) or ganc.all_reduce,
    and the run's parameters equal the TorchScript door's sharded run bit for bit (which
    test_zero.py holds against eager ZeroRedundancyOptimizer)."""
    torch.manual_seed(0)
    gan, spec = zoo.build("dcgan32")
    model, plan = str(tmp_path / "dcgan32.pt"), str(tmp_path / "dcgan32.plan")
    ganc.export(gan, model, spec, joint=True, verbose=False)
    subprocess.run([ganc_bin, "compile", model, "-o", plan, "--zero", str(zero), "--ranks", "2"], check=True,
                   capture_output=True)
    collective = "ganc.reduce_scatter(" if zero == 2 else "ganc.all_reduce("
    assert all(any(op.startswith(collective) for op in ops) for ops in joint_blocks(open(plan).read()).values())
    finals = {}
    for executor in ("joint", "torchscript"):
        out = str(tmp_path / executor)
        r = subprocess.run([ganc_bin, "run", "--nproc", "2", plan, "--model", model, "--data", datasets["digits"],
                            "--steps", "4", "--out", out, "--sample-every", "0", "--checkpoint-every", "4",
                            "--tensorboard", "off", "--executor", executor], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0 and f"optimizer state sharded: zero {zero}" in r.stdout, r.stderr
        finals[executor] = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))
    for sub in ("generator", "discriminator"):
        assert all(torch.equal(t, finals["torchscript"][sub][n]) for n, t in finals["joint"][sub].items()), sub


def test_synchronised_batch_norm_is_not_captured_yet(tmp_path):
    """A joint graph would hold each rank's own batch statistics where the spec asks for every
    rank's: the export refuses it in one line (it would train silently otherwise, since the
    joint door is the default where a plan holds a graph)."""
    gan, spec = zoo.build("dcgan32_syncbn")
    with pytest.raises(ganc.ExportError, match=r"'sync_batch_norm' \(generator\) is not captured yet"):
        ganc.export(gan, str(tmp_path / "s.pt"), spec, joint=True, verbose=False)


def test_the_joint_executor_refuses_what_it_cannot_run(ganc_bin, datasets, tmp_path):
    """An archive exported without joint graphs, a plan that holds none, and a plan whose joint
    graph is not the archive's are refused before any step in one line."""
    torch.manual_seed(0)
    gan, spec = zoo.build("mlp")
    plain, plan = str(tmp_path / "mlp.pt"), str(tmp_path / "mlp.plan")
    ganc.export(gan, plain, spec, joint=False, verbose=False)
    subprocess.run([ganc_bin, "compile", plain, "-o", plan], check=True, capture_output=True)

    def train(plan, model):
        return subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", datasets["ring"],
                               "--steps", "2", "--out", str(tmp_path / "r"), "--executor", "joint"],
                              capture_output=True, text=True)

    r = train(plan, plain)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert (f"--executor joint: phase 'd': {plain} keeps no joint graph for it; export it with "
            "ganc.export(..., joint=True)") in r.stderr, r.stderr

    from test_faults import checked_in
    torch.manual_seed(0)
    gan, spec = zoo.build("mlp")
    model = str(tmp_path / "mlp_joint.pt")
    ganc.export(gan, model, spec, joint=True, verbose=False)
    joint_plan = str(tmp_path / "mlp_joint.plan")
    subprocess.run([ganc_bin, "compile", model, "-o", joint_plan], check=True, capture_output=True)
    text = open(joint_plan).read()
    text = text[:text.rindex("// checksum")]
    # The plan without its joint graphs (as compiled before they were kept).
    stripped = re.sub(r"\n    joint \{\n.*?\n    \}", "", text, flags=re.S)
    assert "joint {" not in stripped
    r = train(checked_in(ganc_bin, tmp_path, stripped), model)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--executor joint: phase 'd': " in r.stderr and "holds no joint graph for it; compile it again from" in r.stderr
    # A node of the plan's graph edited: the plan's placements no longer name the archive's nodes.
    node = next(line for line in joint_blocks(text)["d"] if line.startswith("%addmm = aten::addmm("))
    edited = text.replace(node, node.replace("aten::addmm(", "aten::mm("), 1)
    r = train(checked_in(ganc_bin, tmp_path, edited), model)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert re.search(r"--executor joint: phase 'd': the plan's joint graph is not the archive's: its node \d+ is "
                     r"addmm \(aten::mm\) where the archive has addmm \(aten::addmm\); compile the plan again "
                     "from this archive", r.stderr), r.stderr


# torch.jit's entry points, Python's and the private ones behind them, as a PyTorch without
# TorchScript would have them (pytorch/pytorch#189705 makes the public ones raise).
_WITHOUT_TORCHSCRIPT = '''
import sys, torch
def unavailable(name):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{name} is unavailable: TorchScript is gone")
    return refuse
for name in ("script", "trace", "trace_module", "save", "load", "freeze", "script_if_tracing"):
    setattr(torch.jit, name, unavailable("torch.jit." + name))
for name in ("_jit_script_compile", "_jit_script_class_compile", "_create_function_from_trace",
             "_create_function_from_trace_with_dict", "_create_method_from_trace", "import_ir_module",
             "import_ir_module_from_buffer"):
    if hasattr(torch._C, name):
        setattr(torch._C, name, unavailable("torch._C." + name))
model, state, path = sys.argv[1:4]
sys.path[:0] = sys.argv[4].split(":")
import ganc
from test_joint import build
gan, spec = build(model)
gan.load_state_dict(torch.load(state))
try:
    ganc.export(gan, path + ".ts", spec, verbose=False, torchscript=True)
except Exception as e:  # the export says TorchScript is not there
    print("the TorchScript export:", str(e).splitlines()[0])
ganc.export(gan, path, spec)  # the default: ganc's own archive where TorchScript is unavailable
print("exported", path)
'''

WITHOUT_TORCHSCRIPT = [("mlp", "ring", "ddp"), ("dcgan32", "digits", "ddp"), ("r1gan", "ring", "manual"),
                       ("pggan_quick", "digits", "ddp")]


@pytest.mark.parametrize("model,dataset,reducer", WITHOUT_TORCHSCRIPT)
def test_an_archive_exported_without_torchscript_trains_as_eager_ddp(ganc_bin, datasets, tmp_path, model, dataset,
                                                                     reducer):
    """ganc.export with its defaults in a Python whose torch.jit entry points (public and
    private) raise: it says so in one line and writes ganc's own archive (spec, state, each
    phase's joint graph, the sample grid's graph; no TorchScript code), compiled and trained on
    2 ranks; `torchscript=True` there is refused in one line. Every all-reduced
    gradient and every final parameter equal eager DDP's bit for bit (run here on the same
    weights), the plan's used sets those of the TorchScript door's plan, and the sample grid
    the TorchScript archive's."""
    from test_parity import STEPS, SEED, compare_bitwise, run_ganc
    from ganc import reference
    torch.manual_seed(0)
    gan, spec = build(model)
    state, path, scripted = (str(tmp_path / f"{model}.{ext}") for ext in ("state", "ganc", "pt"))
    torch.save(gan.state_dict(), state)
    r = subprocess.run([sys.executable, "-c", _WITHOUT_TORCHSCRIPT, model, state, path, ":".join(sys.path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    # The patch holds: the TorchScript export cannot run there.
    assert ("the TorchScript export: ganc.export(torchscript=True): TorchScript is unavailable here "
            "(torch.jit.script is unavailable: TorchScript is gone); export with torchscript=False") in r.stdout, r.stdout
    assert ("ganc.export: TorchScript is unavailable here (torch.jit.script is unavailable: TorchScript is gone): "
            "writing ganc's own archive (torchscript=False)") in r.stdout, r.stdout
    ganc.export(gan, scripted, spec, verbose=False)
    assert plan_used(ganc_bin, scripted, tmp_path) == plan_used(ganc_bin, path, tmp_path)
    (tmp_path / "ganc").mkdir()
    got = run_ganc(ganc_bin, model, datasets[dataset], 2, str(tmp_path / "ganc"), path=path)
    ref_dir = str(tmp_path / "ddp")
    reference.run(scripted, datasets[dataset], 2, STEPS, SEED, out_dir=ref_dir, reducer=reducer)
    compare_bitwise(scripted, got, ref_dir)
    if model == "dcgan32":  # the grid drawn through the sample graph, against TorchScript's
        grids = {}
        for name, archive_ in (("joint", path), ("script", scripted)):
            plan = str(tmp_path / f"{name}.plan")
            subprocess.run([ganc_bin, "compile", archive_, "-o", plan], check=True, capture_output=True)
            out = str(tmp_path / f"grid_{name}")
            r = subprocess.run([ganc_bin, "train", plan, "--model", archive_, "--data", datasets[dataset], "--steps",
                                "2", "--out", out, "--sample-every", "2", "--tensorboard", "off"],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            grids[name] = open(os.path.join(out, "samples.png"), "rb").read()
        assert grids["joint"] == grids["script"]


def test_an_archive_without_torchscript_is_read_and_refused_as_it_says(ganc_bin, datasets, tmp_path):
    """ganc's own archive: `ganc explain` says its joint graph is each phase's only code,
    ganc.load_spec reads its spec, and what cannot run it is refused in one line naming the
    file: --executor torchscript, an archive of another version, one missing a phase's graph."""
    gan, spec = zoo.build("mlp")
    path, plan = str(tmp_path / "mlp.ganc"), str(tmp_path / "mlp.plan")
    ganc.export(gan, path, spec, torchscript=False)
    assert ganc.load_spec(path)["name"] == spec["name"]
    subprocess.run([ganc_bin, "compile", path, "-o", plan], check=True, capture_output=True)
    explained = subprocess.run([ganc_bin, "explain", plan], check=True, capture_output=True, text=True).stdout
    assert explained.count("its only code (the archive was exported without TorchScript)") == 2, explained
    r = subprocess.run([ganc_bin, "train", plan, "--model", path, "--data", datasets["ring"], "--steps", "1",
                        "--out", str(tmp_path / "run"), "--executor", "torchscript"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert f"--executor torchscript: {path} was exported without TorchScript" in r.stderr, r.stderr
    stored = torch.load(path, weights_only=True)
    for change, says in ((dict(ganc_archive=2), "a ganc archive of another version (this ganc reads version 1)"),
                         (dict(joint={"d": stored["joint"]["d"]}), "phase 'g' has no joint graph in the archive")):
        broken = str(tmp_path / "broken.ganc")
        torch.save({**stored, **change}, broken)
        r = subprocess.run([ganc_bin, "compile", broken, "-o", str(tmp_path / "b.plan")], capture_output=True,
                           text=True)
        assert r.returncode != 0 and r.stderr.count("\n") == 1 and says in r.stderr and broken in r.stderr, r.stderr
