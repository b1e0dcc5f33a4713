"""The used-parameter analysis against autograd's truth on networks that build lists and dicts by
mutation: `append`, `extend`, `insert`, item assignment, `+=`, list comprehensions, dicts set by
key and by `update`, loops over ModuleLists and ModuleDicts, and containers the loss never reads.

Randomly generated networks (seeded): each is one phase of a GAN module, exported, compiled, and
the plan's used parameters of each phase compared with the parameters eager autograd gives a
gradient. A parameter the plan misses stops a run at its first step; one it adds is all-reduced
for nothing.
"""
import importlib.util
import json
import os
import random
import subprocess

import pytest
import torch

import ganc

CASES = 48   # networks per GAN module (one phase each)
MODULES = 5  # GAN modules: CASES * MODULES generated networks
LAYERS = 8


def statement(rng, layer, containers, free_slots):
    """One random statement writing into a container. Item assignment goes to `slots`, at an
    index no earlier statement wrote (its placeholder, x), so nothing written is overwritten."""
    i, j = layer(), layer()
    target = rng.choice(containers)
    if target == "slots":
        if not free_slots:
            target = "outs"
        else:
            return f"slots[{free_slots.pop()}] = self.layers[{i}](x)"
    if target in ("d", "spare"):
        key = f"k{rng.randrange(10 ** 6)}"
        return rng.choice([
            f"{target}[{key!r}] = self.layers[{i}](x)",
            f"{target}.update({{{key!r}: self.layers[{i}](x)}})",
            f"for name, m in self.named.items():\n        {target}[name + {key!r}] = m(x) * 0.5",
        ])
    return rng.choice([
        f"{target}.append(self.layers[{i}](x))",
        f"{target}.extend([self.layers[{i}](x), self.layers[{j}](x)])",
        f"{target}.insert(0, self.layers[{i}](x))",
        f"{target} += [self.layers[{i}](x)]",
        f"{target} = {target} + [t * 2.0 for t in [self.layers[{i}](x), x]]",
        f"for m in self.named.values():\n        {target}.append(m(x))",
    ])


def network_source(rng, index):
    """A network class whose forward builds lists and dicts by mutation; `junk` and `spare`
    are never read by the loss, the others at random."""
    layers = list(range(LAYERS))
    rng.shuffle(layers)
    taken = iter(layers * 4)
    containers = ["outs", "more", "junk", "d", "spare", "slots"]
    free_slots = [2, 1, 0]
    body = [statement(rng, lambda: next(taken), containers, free_slots) for _ in range(rng.randint(1, 5))]
    read = [c for c in ("outs", "more", "d", "slots") if rng.random() < 0.7] or ["outs"]
    total = " + ".join(f"torch.cat({c}, 1).sum(1, keepdim=True)" if c != "d" else
                       "torch.stack(list(d.values()) + [x], 0).sum(0).sum(1, keepdim=True)" for c in read)
    lines = "\n    ".join(
        ["outs: List[torch.Tensor] = [x]", "more: List[torch.Tensor] = [x]", "junk: List[torch.Tensor] = [x]",
         "slots: List[torch.Tensor] = [x, x, x]",
         "d: Dict[str, torch.Tensor] = {}", "spare: Dict[str, torch.Tensor] = {}"] + body +
        [f"return self.base(x) + {total}"])
    return f'''
class Net{index}(nn.Module):
  def __init__(self):
    super().__init__()
    self.layers = nn.ModuleList([nn.Linear(4, 4, bias=False) for _ in range({LAYERS})])
    self.named = nn.ModuleDict({{"p": nn.Linear(4, 4), "q": nn.Linear(4, 4)}})
    self.base = nn.Linear(4, 1)  # the loss always depends on a parameter

  def forward(self, x):
    {lines}
'''


def gan_source(rng, first):
    nets = [network_source(rng, first + k) for k in range(CASES)]
    phases = "".join(f"\n  def phase_{first + k}(self, real):\n    return self.net{first + k}(real).mean()\n"
                     for k in range(CASES))
    members = "".join(f"\n    self.net{first + k} = Net{first + k}()" for k in range(CASES))
    return ("import torch\nimport torch.nn as nn\nfrom typing import Dict, List\n" + "".join(nets) +
            f"\nclass Generated(nn.Module):\n  def __init__(self):\n    super().__init__(){members}\n" + phases)


def load(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def autograd_used(net, x):
    """The parameters autograd gives a gradient (None is no gradient; zeros are one)."""
    net.zero_grad(set_to_none=True)
    net(x).mean().backward()
    return {name for name, p in net.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("module", range(MODULES))
def test_used_parameters_through_containers_equal_autograds(ganc_bin, tmp_path, module):
    rng = random.Random(1000 + module)
    first = module * CASES
    path = str(tmp_path / f"generated_{module}.py")
    with open(path, "w") as f:
        f.write(gan_source(rng, first))
    torch.manual_seed(0)
    gan = load(path).Generated()
    spec = {"ganc_spec": 1, "name": f"containers{module}", "batch_size": 4, "data": {"shape": [4]},
            "phases": [{"name": f"p{first + k}", "method": f"phase_{first + k}", "updates": [f"net{first + k}"],
                        "inputs": [{"name": "real", "source": "data"}]} for k in range(CASES)],
            "optimizers": {f"net{first + k}": {"type": "sgd", "lr": 0.1} for k in range(CASES)}}
    archive, plan = str(tmp_path / "m.pt"), str(tmp_path / "m.plan")
    # joint=False: the subject is the TorchScript analysis of these containers (a joint graph's
    # used set is the gradients autograd itself computed); capturing 48 graphs per module would
    # only add minutes.
    ganc.export(gan, archive, spec, verbose=False, joint=False)
    subprocess.run([ganc_bin, "compile", archive, "-o", plan], check=True, capture_output=True)
    explained = json.loads(subprocess.run([ganc_bin, "explain", plan, "--json"], capture_output=True, text=True,
                                          check=True).stdout)
    x = torch.randn(4, 4)
    wrong = []
    for k, phase in enumerate(explained["phases"]):
        net = getattr(gan, f"net{first + k}")
        truth = {f"net{first + k}.{name}" for name in autograd_used(net, x)}
        if set(phase["used"]) != truth:
            wrong.append(f"{phase['name']}: plan {sorted(set(phase['used']) - truth)} more, "
                         f"{sorted(truth - set(phase['used']))} fewer than autograd")
    assert not wrong, "\n".join(wrong) + f"\n(the networks: {path})"
