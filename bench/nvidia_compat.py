"""Runs a script of NVIDIA's StyleGAN3 checkout (train.py) unchanged on PyTorch 2.11, with the two
shims it needs there, applied to PyTorch before their code is imported:

- torch.utils.data.Sampler.__init__ no longer takes a data source; their InfiniteSampler
  passes one (`super().__init__(dataset)`): the shim accepts and ignores it, as PyTorch did.
- torch.utils.cpp_extension.load imports the module it builds without putting its build
  folder on sys.path, and their custom_ops then imports it by name
  (`importlib.import_module('bias_act_plugin')`): the shim puts the loaded module into
  sys.modules under its name, so their CUDA plugins (bias_act, upfirdn2d) load.

With GANC_NVIDIA_REFERENCE_OPS=1 their two plugins are not loaded: bias_act and upfirdn2d
take their reference paths (separate PyTorch operations, as ganc's export traces them), so
train.py runs the very operations ganc's archive holds, eagerly.

    python bench/nvidia_compat.py REPO/train.py [train.py's options]
"""
import os
import runpy
import sys

import torch.utils.cpp_extension
import torch.utils.data


def _sampler_init(self, data_source=None):
    pass


def _load(name, *args, **kwargs):
    module = _original_load(name, *args, **kwargs)
    if module is not None:
        sys.modules.setdefault(name, module)
    return module


torch.utils.data.Sampler.__init__ = _sampler_init
_original_load = torch.utils.cpp_extension.load
torch.utils.cpp_extension.load = _load

def reference_ops():
    """Their plugins' loaders answer "not available", so each op takes its reference path."""
    from torch_utils.ops import bias_act, upfirdn2d
    bias_act._init = lambda: False
    upfirdn2d._init = lambda: False
    print("nvidia_compat: bias_act and upfirdn2d take their reference paths",
          flush=True)


if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    if os.environ.get("GANC_NVIDIA_REFERENCE_OPS") == "1":
        reference_ops()
    runpy.run_path(script, run_name="__main__")
