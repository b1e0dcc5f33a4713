"""Runs the GPU tests, or, on a machine without a CUDA GPU, says so and exits 77 so that
ctest lists them as Skipped (not as passed)."""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA GPU on this machine; tests/python/test_cuda.py (CUDA Graph replay "
              "vs eager, parity with eager DDP on NCCL, host-sync fallback) needs one")
        sys.exit(77)
    sys.exit(pytest.main(["-v", "-rs", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning",
                          os.path.join(HERE, "test_cuda.py")]))
