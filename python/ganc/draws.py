"""NumPy draws that become tensors, recorded as random ops of ganc's stream.

Networks such as the adversarial autoencoder's and UNIT's reparameterisation draw noise with
NumPy and turn it into a tensor (`Tensor(np.random.normal(0, 1, (n, d)))`). A trace would
freeze that draw into the archive as a constant. While ganc traces a network (and while it
runs the network eagerly to check the trace), numpy.random's module-level draws with scalar
parameters and a size are drawn by torch instead (`torch.randn` or `torch.rand` in float64,
scaled and shifted as NumPy's formula does), and each traced constant that holds one of those
draws becomes the same random op in the graph: it draws anew at every step from ganc's random
stream, and the eager check draws what the trace draws. A draw whose value does not reach a
tensor as drawn is refused, as is a Python-level decision on a draw (a scalar draw,
`random.random()`)."""
from __future__ import annotations

import contextlib
import numbers
import os
import sys
from dataclasses import dataclass

import torch

from .scriptable import _location

try:  # numpy is optional: a model without it draws nothing with it
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

_SKIPPED = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))

__all__ = ["Draw", "as_random_ops", "substitutable", "substituted"]


def _dim(d):
    """A size as an int: a tracer hands sizes taken from tensors (`x.size(0)`) as 0-dim tensors."""
    if isinstance(d, torch.Tensor) and d.dim() == 0 and not d.is_floating_point():
        return int(d)
    return int(d) if isinstance(d, numbers.Integral) and d >= 0 else None


def _size(size):
    if size is None:
        return None
    dims = tuple(_dim(d) for d in ((size,) if isinstance(size, (numbers.Integral, torch.Tensor)) else size))
    return dims if None not in dims else None


# numpy.random's draws that have a torch twin: how each reads its arguments, as (the torch
# factory, the scale, the shift, the size); NumPy computes shift + scale * standard draw.
def _normal(loc=0.0, scale=1.0, size=None):
    return "randn", scale, loc, size


def _standard_normal(size=None):
    return "randn", 1.0, 0.0, size


def _randn(*dims):
    return "randn", 1.0, 0.0, dims or None


def _uniform(low=0.0, high=1.0, size=None):
    return "rand", high - low, low, size


def _rand(*dims):
    return "rand", 1.0, 0.0, dims or None


def _random(size=None):
    return "rand", 1.0, 0.0, size


_TWINS = {"normal": _normal, "standard_normal": _standard_normal, "randn": _randn, "uniform": _uniform,
          "rand": _rand, "random": _random, "random_sample": _random}


@dataclass
class Draw:
    """One numpy.random call drawn by torch: where it was made and what it drew."""
    function: str
    where: str
    factory: str
    scale: float
    shift: float
    values: torch.Tensor
    found: int = 0

    def describe(self) -> str:
        return f"numpy.random.{self.function}() ({self.where})"


def substitutable(function: str, args, kwargs):
    """(factory, scale, shift, shape) where numpy.random.`function`(*args, **kwargs) has a torch
    twin (scalar parameters, a size: an array), else None."""
    twin = _TWINS.get(function)
    if twin is None:
        return None
    try:
        factory, scale, shift, size = twin(*args, **kwargs)
    except TypeError:
        return None
    shape = _size(size)
    real = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (scale, shift))
    return (factory, float(scale), float(shift), shape) if real and shape is not None else None


def _caller(frame) -> str:
    """file:line of the first frame outside torch, ganc and numpy: the user's draw."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_SKIPPED) or "/numpy/" in name):
            return _location(name, frame.f_lineno)
        frame = frame.f_back
    return "<unknown>"


_RECORDS: list = []  # one list of Draws per open substituted() context, innermost last
_SAVED: dict = {}


@contextlib.contextmanager
def _untraced():
    """Outside any trace: the draw itself is not recorded (its value is, as a constant, which
    as_random_ops then finds), nor its sizes read as ints."""
    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)


def _drawn_by_torch(function, original):
    def draw(*args, **kwargs):
        with _untraced():
            twin = substitutable(function, args, kwargs) if _RECORDS else None
            if twin is None:
                return original(*args, **kwargs)
            factory, scale, shift, shape = twin
            values = getattr(torch, factory)(shape, dtype=torch.float64)
            if scale != 1.0:
                values = values * scale
            if shift != 0.0:
                values = values + shift
            drawn = values.numpy()
        _RECORDS[-1].append(Draw(function, _caller(sys._getframe(1)), factory, scale, shift, values))
        return drawn
    return draw


@contextlib.contextmanager
def substituted():
    """Inside: numpy.random's draws that have a torch twin are drawn by torch (see the module's
    docstring); yields the list of the draws made (this context's, not an inner one's)."""
    records: list = []
    if _np is not None and not _RECORDS:
        for name in _TWINS:
            _SAVED[name] = getattr(_np.random, name)
            setattr(_np.random, name, _drawn_by_torch(name, _SAVED[name]))
    _RECORDS.append(records)
    try:
        yield records
    finally:
        _RECORDS.pop()
        if _np is not None and not _RECORDS:
            for name, fn in _SAVED.items():
                setattr(_np.random, name, fn)
            _SAVED.clear()


# TorchScript's numbers of the floating dtypes a draw may be cast to before it becomes a tensor
# (`.astype(np.float32)`).
_SCALAR_TYPES = {torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}


def _random_op(graph, constant, draw):
    """Inserts before `constant` the random op that draws what `draw` drew (in float64, then
    cast to the constant's dtype, as NumPy's array was); returns its value."""
    out_type = constant.output().type()
    dtype = constant.t("value").dtype
    with graph.insert_point_guard(constant):
        sizes = graph.insertNode(graph.create("prim::ListConstruct",
                                              [graph.insertConstant(int(d)) for d in draw.values.shape]))
        sizes.output().setType(torch._C.ListType.ofInts())
        made = graph.insertNode(graph.create("aten::" + draw.factory, [
            sizes.output(), graph.insertConstant(7),  # float64, as NumPy draws
            graph.insertConstant(None), graph.insertConstant(torch.device("cpu")), graph.insertConstant(False)]))
        made.output().setType(out_type)
        value = made.output()
        if draw.scale != 1.0:
            node = graph.insertNode(graph.create("aten::mul", [value, graph.insertConstant(draw.scale)]))
            node.output().setType(out_type)
            value = node.output()
        if draw.shift != 0.0:
            node = graph.insertNode(graph.create("aten::add", [value, graph.insertConstant(draw.shift),
                                                               graph.insertConstant(1)]))
            node.output().setType(out_type)
            value = node.output()
        if dtype != torch.float64:
            node = graph.insertNode(graph.create("aten::to", [
                value, graph.insertConstant(_SCALAR_TYPES[dtype]), graph.insertConstant(False),
                graph.insertConstant(False), graph.insertConstant(None)]))
            node.output().setType(out_type)
            value = node.output()
    return value


def _holds(value: torch.Tensor, draw: Draw) -> bool:
    """Whether a traced constant holds `draw`'s values (cast to a floating dtype or not)."""
    return (value.dtype in _SCALAR_TYPES and value.shape == draw.values.shape
            and torch.equal(value, draw.values.to(value.dtype)))


def as_random_ops(traced, draws) -> None:
    """Every constant of `traced`'s graphs that holds one of `draws`' values becomes that draw's
    random op (its device then follows the method's input, as other factories' do)."""
    if not draws:
        return
    for module in traced.modules():
        for name in module._c._method_names():
            graph = module._c._get_method(name).graph
            for node in list(graph.nodes()):
                if node.kind() != "prim::Constant" or node.output().type().kind() != "TensorType":
                    continue
                value = node.t("value")
                draw = next((d for d in draws if _holds(value, d)), None)
                if draw is None:
                    continue
                node.output().replaceAllUsesWith(_random_op(graph, node, draw))
                node.destroy()
                draw.found += 1
