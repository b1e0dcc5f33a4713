"""The `ganc` console command that `pip install` puts on PATH.

`ganc compile|explain|train|run` are the C++ driver, executed in place of this process (so
signals, exit codes and torchrun's process management see the driver itself); `ganc plot`
(matplotlib) and `ganc stylegan` (a StyleGAN2 run shaped like NVIDIA's train.py: export,
compile, `ganc run` and network pickles) are Python.
"""
from __future__ import annotations

import os
import sys

__all__ = ["main", "tools_dir", "executable"]


class ToolsNotFound(RuntimeError):
    """ganc's C++ tools are neither installed with the package nor in a named build tree."""


def tools_dir() -> str:
    """The directory holding the `ganc` and `ganc-opt` executables: the package's own (pip
    install), the build tree of an editable install, or $GANC_BUILD_DIR/tools (a source
    checkout built with CMake)."""
    build_dir = os.environ.get("GANC_BUILD_DIR")
    if build_dir:
        return os.path.join(build_dir, "tools")
    try:
        from . import _build
    except ImportError:
        raise ToolsNotFound("ganc's tools are not built: `pip install .` in the ganc checkout, "
                            "or set GANC_BUILD_DIR to a CMake build directory") from None
    return _build.TOOLS_DIR or os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")


def executable(name: str = "ganc") -> str:
    path = os.path.join(tools_dir(), name)
    if not os.access(path, os.X_OK):
        raise ToolsNotFound(f"{path} is missing: rebuild ganc (pip install . or cmake --build)")
    return path


def check_torch() -> None:
    """ganc links the torch it was built against; another version would fail at load time
    with an undefined symbol, so say what happened instead."""
    try:
        from . import _build
    except ImportError:
        return
    from importlib import metadata
    try:
        have = metadata.version("torch")
    except metadata.PackageNotFoundError:
        have = None
    built = _build.TORCH_VERSION
    if have is None or have.split("+")[0] != built.split("+")[0]:
        raise ToolsNotFound(f"ganc was built against torch {built}, this environment has "
                            f"{have or 'no torch'}: reinstall ganc (pip install --force-reinstall "
                            f"--no-deps <ganc checkout>)")


def environment() -> dict:
    """The environment the driver runs in: it starts Python helpers (the TensorBoard writer)
    with this interpreter."""
    env = dict(os.environ)
    env.setdefault("GANC_PYTHON", sys.executable)
    return env


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plot":
        from .plot import main as plot_main
        return plot_main(argv[1:])
    if argv and argv[0] == "stylegan":  # in place of this process, as the driver is
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "ganc.stylegan", *argv[1:]])
    try:
        check_torch()
        path = executable()
    except ToolsNotFound as e:
        print(f"ganc: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execve(path, [path, *argv], environment())
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
