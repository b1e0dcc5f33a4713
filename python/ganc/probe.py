"""The probe of the hybrid export: every phase run once eagerly, recording each submodule's
calls from outside it (the tensors a scripted caller will pass), every
torch.autograd.Function applied, and what a trace would freeze: Python randomness (`random`,
`numpy.random`) and tensor values turned into Python values (`if tensor:`, `.item()`,
`float(tensor)`) inside a module. hybrid.py resolves what to script and trace from it;
tracing.py traces at the calls it recorded and refuses the hazards it found."""
from __future__ import annotations

import contextlib
import inspect
import os
import random
import sys
import traceback
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from . import draws, functions
from .scriptable import _location

__all__ = ["Call", "Hazard", "Probe", "where_of"]


@dataclass
class Call:
    """One call of a submodule's method from outside the submodule: in which phase it was
    first made, whether autograd recorded it, and whether a phase differentiated it twice
    (R1, path length: `torch.autograd.grad(create_graph=True)` after it)."""
    method: str
    args: tuple
    kwargs: dict
    training: bool
    phase: str = ""
    grad: bool = True
    twice: bool = False
    form: object = None  # how a traced network takes it (ganc.trace_calls.Form), where not by position

    def signature(self):
        return (self.method, self.training, tuple(_shape_of(a) for a in self.args),
                tuple(sorted((k, _shape_of(v)) for k, v in self.kwargs.items())))


@dataclass
class Hazard:
    """Something a trace would freeze, seen inside module `path` while probing."""
    path: str
    where: str
    construct: str
    advice: str = ""  # what the trace would do and what to write instead, where not the default
    # A numpy draw with a torch twin: a traced network (not a phase traced whole) draws it as a
    # random op of ganc's stream instead (ganc.draws).
    substitute: bool = False


_TWIN = ("a trace would freeze it, the same every step; export without trace=True (a network traced alone draws "
         "it from ganc's random stream), or draw it with torch")


def _shape_of(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    return ("value", repr(value))


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    return value


_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))
_STDLIB_DIR = os.path.dirname(os.__file__)


def _user_frame(frame):
    """The first frame outside torch and ganc: where the user's code is."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_TORCH_DIR) or name.startswith(_OWN_DIR) or name == random.__file__
                or "/numpy/" in name):
            return frame
        frame = frame.f_back
    return None


_GRAD_MODE_FILE = torch.autograd.grad_mode.__file__
_CONTEXTLIB_FILE = torch.utils._contextlib.__file__


def _decorated_site(frame):
    """Where a gradient-mode switch made by a torch decorator (`@torch.no_grad()`,
    `@torch.inference_mode()`) was written: (the decorator's name, the decorated function's
    first line) when `frame`'s chain passes through the decorator's wrapper before reaching the
    user's code; else None."""
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        func = frame.f_locals.get("func") if frame.f_code.co_filename == _CONTEXTLIB_FILE else None
        code = getattr(inspect.unwrap(func), "__code__", None) if callable(func) else None
        if code is not None:
            factory = frame.f_locals.get("ctx_factory")
            owner = getattr(factory, "__self__", factory)
            name = owner.__name__ if isinstance(owner, type) else type(owner).__name__
            return (f"a @torch.{name}() function ({func.__qualname__})",
                    _location(code.co_filename, code.co_firstlineno))
        frame = frame.f_back
    return None


def raised_at(error: BaseException) -> str:
    """file:line of the innermost frame of the user's code in `error`'s traceback, or ""."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith((_TORCH_DIR, _OWN_DIR))]
    return _location(frames[-1].filename, frames[-1].lineno) if frames else ""


def where_of(obj) -> str:
    """file:line of a class or function's definition (its forward's, for a module)."""
    target = obj
    if isinstance(obj, nn.Module):
        target = type(obj).forward if type(obj).forward is not nn.Module.forward else type(obj)
    try:
        target = inspect.unwrap(target)
        return _location(inspect.getsourcefile(target), inspect.getsourcelines(target)[1])
    except (TypeError, OSError):
        return "<unknown>"


try:  # numpy is optional: a model without it has no numpy randomness to find
    import numpy as _np
    _RNG_TYPES = (random.Random, _np.random.RandomState, _np.random.Generator)
except ImportError:  # pragma: no cover
    _np = None
    _RNG_TYPES = (random.Random,)


# numpy.random functions that set or read the generator's state rather than draw from it.
_NUMPY_STATE = {"seed", "get_state", "set_state", "default_rng", "get_bit_generator", "set_bit_generator"}


class Probe:
    """Records, while the phases run eagerly, the calls into each submodule of `root` from
    outside it, the autograd Functions applied, and the hazards a trace would freeze."""

    # Tensor methods that hand a tensor's value to Python, where a trace turns it into a constant.
    _TO_PYTHON = {"__bool__": "Python branch on a tensor value (`if tensor:`, `while`, `and`/`or`)",
                  "item": "tensor.item()", "__float__": "float(tensor)", "__int__": "int(tensor)",
                  "tolist": "tensor.tolist()"}

    def __init__(self, root: nn.Module):
        self.root = root
        self.paths = {id(m): p for p, m in root.named_modules() if p}
        self.calls: dict[str, list[Call]] = defaultdict(list)
        self.hazards: list[Hazard] = []
        self.functions = functions.Recorder()
        self.stack: list[str] = []
        self._seen = set()
        # Gradient-mode changes inside a module (`torch.no_grad()` blocks): a trace does not
        # record them, so they are named where a trace's gradients differ from eager's.
        self.grad_blocks: list[Hazard] = []
        self.phase = ""
        self._phase_calls: list[Call] = []
        self._parameters: dict[int, str] = {}
        self._buffers: dict[int, str] = {}

    def begin_phase(self, name: str) -> None:
        """Calls recorded from now on belong to phase `name`."""
        self.phase = name
        self._phase_calls = []

    def _differentiated_twice(self) -> None:
        for call in self._phase_calls:
            call.twice = True

    # -- what a hazard is attributed to ------------------------------------------------------
    def _inside(self):
        return self.stack[-1] if self.stack else None

    def _hazard(self, construct, frame, into=None, advice="", substitute=False, where=None):
        path = self._inside()
        if path is None:
            return
        if where is None:
            user = _user_frame(frame)
            where = _location(user.f_code.co_filename, user.f_lineno) if user else "<unknown>"
        key = (path, where, construct)
        if key not in self._seen:
            self._seen.add(key)
            (self.hazards if into is None else into).append(Hazard(path, where, construct, advice, substitute))

    def _record(self, path, method, args, kwargs, module):
        caller = self._inside()
        if caller is not None and (caller == path or caller.startswith(path + ".")):
            return  # a call from inside the module itself: a trace of the module records it
        call = Call(method, _clone(tuple(args)), _clone(dict(kwargs)), module.training, self.phase,
                    torch.is_grad_enabled())
        known = next((c for c in self.calls[path] if c.signature() == call.signature()), None)
        if known is None:
            self.calls[path].append(call)
        else:
            known.grad = known.grad or call.grad
        self._phase_calls.append(known or call)

    # -- the hooks -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self):
        handles = []
        wrapped = []
        for module in self.root.modules():
            path = self.paths.get(id(module))
            if path is None or isinstance(module, torch.jit.ScriptModule):
                continue  # a network the user scripted or traced: taken as it is, never traced again

            def pre(mod, args, kwargs, path=path):
                self._record(path, "forward", args, kwargs, mod)
                self.stack.append(path)

            def post(mod, args, kwargs, output, path=path):
                if self.stack and self.stack[-1] == path:
                    self.stack.pop()

            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
            for name in _public_methods(type(module)):
                wrapped.append((module, name))
                module.__dict__[name] = self._wrap_method(module, path, name, getattr(module, name))
        saved = {name: getattr(torch.Tensor, name) for name in self._TO_PYTHON}
        for name, construct in self._TO_PYTHON.items():
            setattr(torch.Tensor, name, self._wrap_to_python(saved[name], construct))
        # numpy's generators are Cython functions, which the profile hook does not see: its
        # module-level draws are wrapped instead while the probe runs.
        numpy_draws = {name: getattr(_np.random, name) for name in getattr(_np.random, "__all__", [])
                       if callable(getattr(_np.random, name, None)) and name[0].islower()
                       and name not in _NUMPY_STATE} if _np is not None else {}
        for name, fn in numpy_draws.items():
            setattr(_np.random, name, self._wrap_draw(fn, f"numpy.random.{name}() (Python randomness)", name))
        self._parameters = {_storage(p): n for n, p in self.root.named_parameters(remove_duplicate=False)}
        self._buffers = {_storage(b): n for n, b in self.root.named_buffers(remove_duplicate=False)}
        self._parameters.pop(0, None)
        self._buffers.pop(0, None)
        saved_grad = {name: getattr(torch.autograd, name) for name in ("grad", "backward")}
        for name, fn in saved_grad.items():
            setattr(torch.autograd, name, self._wrap_autograd(fn))
        old_profile = sys.getprofile()
        sys.setprofile(self._profile)
        try:
            with self.functions.recording(lambda: self._inside()), _Watch(self):
                yield self
        finally:
            sys.setprofile(old_profile)
            for name, fn in saved_grad.items():
                setattr(torch.autograd, name, fn)
            for name, fn in numpy_draws.items():
                setattr(_np.random, name, fn)
            for name, fn in saved.items():
                setattr(torch.Tensor, name, fn)
            for module, name in wrapped:
                module.__dict__.pop(name, None)
            for h in handles:
                h.remove()
            self.stack.clear()

    def _wrap_method(self, module, path, name, bound):
        def method(*args, **kwargs):
            self._record(path, name, args, kwargs, module)
            self.stack.append(path)
            try:
                return bound(*args, **kwargs)
            finally:
                self.stack.pop()
        return method

    def _wrap_autograd(self, original):
        probe = self

        def differentiate(*args, **kwargs):
            if kwargs.get("create_graph"):
                probe._differentiated_twice()
            return original(*args, **kwargs)
        return differentiate

    def _wrap_to_python(self, original, construct):
        probe = self

        def to_python(tensor, *args, **kwargs):
            probe._hazard(construct, sys._getframe(1))
            return original(tensor, *args, **kwargs)
        return to_python

    def _watched(self, func, args, out):
        """What a TorchFunctionMode sees inside a module: gradient switched off, tensor hooks,
        a parameter read into a Python or numpy value or changed in place, a buffer updated in
        place with a value autograd tracks."""
        name = getattr(func, "__name__", "")
        reads = name in ("numpy", "__array__", "tolist") or (
            name == "__get__" and getattr(getattr(func, "__self__", None), "__name__", "") == "data")
        in_place = name.endswith("_") and not name.startswith("_") and name not in _NOT_IN_PLACE
        switch = name == "_set_grad_enabled" and bool(args) and args[0] is False
        if not (reads or in_place or switch or name == "register_hook"):
            return
        frame = sys._getframe(2)
        if _own_code(frame):
            return
        if switch:
            self._grad_block("a torch.no_grad() block", frame)
            return
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if target is None:
            return
        if name == "register_hook":
            self._hazard("a tensor hook (tensor.register_hook)", frame,
                         advice="a trace does not record hooks, so the gradient would not pass through it; "
                                "write what the hook does as a torch.autograd.Function or make the module "
                                "scriptable")
            return
        storage = _storage(target)
        param = self._parameters.get(storage)
        if reads and param is not None:
            how = {"numpy": ".numpy()", "__array__": "np.asarray", "tolist": ".tolist()"}.get(name, ".data")
            self._hazard(f"parameter {param!r} read as a value ({how})", frame,
                         advice="a trace freezes the value it had at export as a constant, so the parameter "
                                "would neither train nor take a gradient; use the tensor itself")
        elif in_place and param is not None:
            # `p.data.clamp_()`: the change is the construct, not the `.data` read before it.
            self.hazards = [h for h in self.hazards if not (h.construct.startswith(f"parameter {param!r} read")
                                                            and h.path == self._inside())]
            self._seen = {k for k in self._seen if not (k[2].startswith(f"parameter {param!r} read"))}
            self._hazard(f"parameter {param!r} changed in place in forward (.{name}())", frame,
                         advice="a trace does not record it, so the change would never happen; change "
                                "parameters in the training loop (a constraint as an optimizer step), not in "
                                "forward")
        elif in_place and storage in self._buffers and isinstance(out, torch.Tensor) and out.requires_grad:
            self._hazard(f"buffer {self._buffers[storage]!r} updated in place with a value that carries "
                         f"gradient (.{name}())", frame,
                         advice="its autograd history would reach into the next step's backward; update it "
                                "under torch.no_grad() or with a .detach()ed value")

    def _wrap_draw(self, draw, construct, function):
        probe = self

        def recorded(*args, **kwargs):
            # A draw with a torch twin becomes a random op in the trace (ganc.draws); any
            # other stays what a trace would freeze.
            twin = draws.substitutable(function, args, kwargs)
            probe._hazard(construct, sys._getframe(1), advice=_TWIN if twin else "", substitute=twin is not None)
            return draw(*args, **kwargs)
        return recorded

    def _grad_block(self, construct, frame):
        """A gradient-mode block inside a module, named by its own line: the `with` line, or the
        first line of a function a torch decorator switches (not the line that calls it)."""
        construct, where = _decorated_site(frame) or (construct, None)
        self._hazard(construct, frame, into=self.grad_blocks, where=where,
                     advice="a trace records its operations with gradients, so they train otherwise "
                            "than eager; keep what must not be differentiated out of the traced network "
                            "or .detach() it")

    def _profile(self, frame, event, arg):
        if not self.stack:
            return
        if (event == "call" and frame.f_code.co_name == "__enter__" and frame.f_code.co_filename == _GRAD_MODE_FILE
                and isinstance(frame.f_locals.get("self"), torch.inference_mode)
                and frame.f_locals["self"].mode and not _own_code(frame)):
            self._grad_block("a torch.inference_mode() block", frame.f_back)
            return
        if event == "c_call":
            owner = getattr(arg, "__self__", None)
            if isinstance(owner, _RNG_TYPES):
                module = "random" if isinstance(owner, random.Random) else "numpy.random"
                self._hazard(f"{module}.{arg.__name__}() (Python randomness)", frame)
        elif event == "call" and frame.f_code.co_filename == random.__file__:
            caller = frame.f_back
            if caller is not None and caller.f_code.co_filename != random.__file__:
                self._hazard(f"random.{frame.f_code.co_name}() (Python randomness)", caller)

    def hazards_in(self, path: str) -> list[Hazard]:
        return [h for h in self.hazards if h.path == path or h.path.startswith(path + ".")]


# In-place-looking names that do not change their tensor's values.
_NOT_IN_PLACE = {"requires_grad_", "retain_grad_", "share_memory_", "record_stream_"}


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, sparse)
        return 0


def _own_code(frame) -> bool:
    """Whether the first frame outside torch is ganc's (its scriptable layers, its checks)."""
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(_OWN_DIR)


class _Watch(TorchFunctionMode):
    """Shows the probe every torch operation run inside a submodule."""

    def __init__(self, probe):
        super().__init__()
        self.probe = probe

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.probe.stack:
            self.probe._watched(func, args, out)
        return out


def _public_methods(cls) -> list[str]:
    """Methods a user class defines besides forward (scripted code may call them on a traced
    module): public functions of the classes between it and nn.Module."""
    names = []
    for klass in cls.__mro__:
        if klass is nn.Module or klass.__module__.startswith("torch."):
            break
        for name, value in vars(klass).items():
            if (inspect.isfunction(value) and not name.startswith("_") and name != "forward"
                    and name not in names):
                names.append(name)
    return names
