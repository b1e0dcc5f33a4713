"""TorchScript takes an unannotated parameter for a tensor, whatever its default: the phases'
helper `def run_G(self, z, c, update_emas=False)` (StyleGAN's loss) does not script. While the
phases are scripted, the source TorchScript reads of the GAN class's methods says such a
parameter's type: the default's (bool, int, float or str), as the author meant it.

TorchScript reads a method's source through `inspect`, which reads `linecache`: the file's lines
are put there with `: bool` after each such parameter's name, on the same lines (so errors name
the user's file:line), and taken back afterwards. Their files are not touched."""
from __future__ import annotations

import ast
import contextlib
import inspect
import linecache
import os
import textwrap

import torch

__all__ = ["constants_typed"]

_TYPES = (bool, int, float, str)


def _untyped(fn) -> dict:
    """name -> type of `fn`'s unannotated parameters whose default is a bool, int, float or str."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    return {n: type(p.default) for n, p in parameters.items()
            if p.annotation is inspect.Parameter.empty and type(p.default) in _TYPES}


def _edits(fn, types: dict) -> list:
    """(line index in the file, column, text) inserting each parameter's type after its name."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return []
    source = "".join(lines)
    indent = len(lines[0]) - len(lines[0].lstrip())
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
    edits = []
    for a in args:
        if a.arg in types and a.annotation is None:
            line = lines[a.lineno - 1].encode()  # ast's columns count UTF-8 bytes
            column = len(line[:indent + a.end_col_offset].decode(errors="ignore"))
            edits.append((first - 1 + a.lineno - 1, column, f": {types[a.arg].__name__}"))
    return edits


@contextlib.contextmanager
def constants_typed(klass):
    """For the duration of the block, the source of `klass`'s own methods (and of its bases
    below nn.Module) as TorchScript reads it gives each unannotated parameter with a bool,
    int, float or str default that type."""
    by_file: dict[str, list] = {}
    for k in klass.__mro__:
        if k in (torch.nn.Module, object):
            break
        for fn in vars(k).values():
            fn = getattr(fn, "__func__", fn)
            if not inspect.isfunction(fn):
                continue
            types = _untyped(fn)
            if types:
                path = inspect.getsourcefile(fn)
                if path and os.path.isfile(path):
                    by_file.setdefault(path, []).extend(_edits(fn, types))
    saved = {}
    for path, edits in by_file.items():
        if not edits:
            continue
        lines = list(linecache.getlines(path))
        if not lines:
            continue
        for index, column, text in sorted(edits, reverse=True):  # right to left: columns stay valid
            line = lines[index]
            lines[index] = line[:column] + text + line[column:]
        stat = os.stat(path)
        saved[path] = linecache.cache.get(path)
        linecache.cache[path] = (stat.st_size, stat.st_mtime, lines, path)
    try:
        yield
    finally:
        for path, entry in saved.items():
            if entry is None:
                linecache.cache.pop(path, None)
            else:
                linecache.cache[path] = entry
