"""ganc.augment.AugmentPipe against NVIDIA's own `training.augment.AugmentPipe`: every pipe of
train.py's --augpipe at p = 0, 0.5 and 1, the same torch seed on both sides, ganc's pipe built by
`ganc.augment.from_nvidia(theirs)`. Prints and records the largest difference of the augmented
images (relative to their largest magnitude) and the time of one call of each side here.

Their code is not in this tree (its licence): pass a checkout of
https://github.com/NVlabs/stylegan2-ada-pytorch (its dnnlib imports `requests`; its augment.py
`scipy`).

    python bench/augment_nvidia.py --repo external/stylegan2-ada-pytorch [--batch 8 --size 64]
                                   [--device cuda]
"""
from __future__ import annotations

import argparse
import sys
import time

import results  # noqa: E402  (first: the repository's python/ and models/ on sys.path)

import torch  # noqa: E402

from ganc import augment  # noqa: E402


def timed(fn, device, repeat=3):
    """The best of `repeat` calls, in seconds (after one untimed call; the GPU synchronised)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    best = float("inf")
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="a stylegan2-ada-pytorch checkout")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (NVIDIA's upfirdn2d then builds its plugin)")
    parser.add_argument("--no-save", action="store_true", help="print only")
    args = parser.parse_args()
    sys.path.insert(0, args.repo)
    from training import augment as theirs_module

    device = torch.device(args.device)
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, args.size, args.size, device=device)
    rows, numbers = [], {}
    for name, settings in augment.PIPES.items():
        theirs = theirs_module.AugmentPipe(**settings).to(device)  # train.py's augpipe_specs[name]
        ours = torch.jit.script(augment.from_nvidia(theirs).to(device))
        worst = 0.0
        for p in (0.0, 0.5, 1.0):
            theirs.p.fill_(p)
            torch.manual_seed(1)
            a = theirs(images)
            torch.manual_seed(1)
            b = ours(images, torch.tensor(p, device=device))
            worst = max(worst, ((a - b).abs().max() / a.abs().max()).item())
        theirs.p.fill_(1.0)
        t_theirs = timed(lambda: theirs(images), device)
        t_ours = timed(lambda: ours(images, torch.tensor(1.0, device=device)), device)
        numbers[name] = {"max_relative_difference": worst, "nvidia_ms": t_theirs * 1e3, "ganc_ms": t_ours * 1e3}
        rows.append([name, f"{worst:.1e}", f"{t_theirs * 1e3:.1f}", f"{t_ours * 1e3:.1f}",
                     f"{t_theirs / t_ours:.2f}x"])
        print(f"{name:7s} largest difference {worst:.1e}  NVIDIA {t_theirs * 1e3:7.1f} ms  ganc {t_ours * 1e3:7.1f} ms")
    if not args.no_save:
        table = {"columns": ["pipe", "largest difference (relative)", "NVIDIA ms", "ganc ms", "speed"], "rows": rows}
        results.write("augment_nvidia" + ("_cuda" if device.type == "cuda" else ""), f"ganc.augment against NVIDIA's AugmentPipe, same seed, p 0 / 0.5 / 1, "
                      f"batch {args.batch} at {args.size} px, one call (p = 1) timed on the {device.type.upper()}", numbers,
                      table)


if __name__ == "__main__":
    main()
