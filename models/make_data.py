"""Packs a training set into a tensor file that `ganc train --data` reads (torch.save).

    python3 models/make_data.py digits -o digits32.pt [--size 32]   # scikit-learn's bundled
                                                                   # 8x8 digits, upscaled, RGB
    python3 models/make_data.py ring -o ring.pt                     # 2-D ring of 8 Gaussians

Nothing is downloaded: the digits ship inside the scikit-learn package.
"""
import argparse
import math

import torch
import torch.nn.functional as F


def digits(size: int) -> torch.Tensor:
    from sklearn.datasets import load_digits
    images = torch.tensor(load_digits().images, dtype=torch.float32)  # [1797, 8, 8], 0..16
    images = images.unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)
    return (images * 2 - 1).expand(-1, 3, -1, -1).contiguous()


def ring(n: int = 4096, modes: int = 8, radius: float = 1.5, std: float = 0.05) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    k = torch.randint(0, modes, (n,), generator=g).float()
    angle = 2 * math.pi * k / modes
    centers = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], 1)
    return centers + std * torch.randn(n, 2, generator=g)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=["digits", "ring"])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--size", type=int, default=32)
    args = parser.parse_args()
    data = digits(args.size) if args.name == "digits" else ring()
    torch.save(data, args.output)
    print(f"wrote {args.output}: {tuple(data.shape)}")


if __name__ == "__main__":
    main()
