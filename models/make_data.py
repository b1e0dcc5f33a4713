"""Packs a training set into a tensor file that `ganc train --data` reads (torch.save).

    python3 models/make_data.py digits -o digits32.pt [--size 32]   # scikit-learn's bundled
                                                                   # 8x8 digits, upscaled, RGB
    python3 models/make_data.py ring -o ring.pt                     # 2-D ring of 8 Gaussians
    python3 models/make_data.py two_domains -o ab.pt                # unpaired 2-D domains A, B
    python3 models/make_data.py pairs -o pairs16.pt [--size 16]     # fields A and B: a digit's
                                                                   # outline and the digit coloured

Nothing is downloaded: the digits ship inside the scikit-learn package.
"""
import argparse
import math

import torch
import torch.nn.functional as F


def digits(size: int) -> dict:
    """{'images': [1797, 3, size, size] in [-1, 1], 'labels': [1797] digit classes}."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)  # [1797, 8, 8], 0..16
    images = images.unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)
    return {"images": (images * 2 - 1).expand(-1, 3, -1, -1).contiguous(),
            "labels": torch.tensor(digits.target, dtype=torch.long)}


def ring(n: int = 4096, modes: int = 8, radius: float = 1.5, std: float = 0.05) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    k = torch.randint(0, modes, (n,), generator=g).float()
    angle = 2 * math.pi * k / modes
    centers = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], 1)
    return centers + std * torch.randn(n, 2, generator=g)


def two_domains(n: int = 4096) -> torch.Tensor:
    """Unpaired samples of two 2-D domains: A a ring of 8 Gaussians, B a 3x3 grid of them."""
    a = ring(n)
    g = torch.Generator().manual_seed(1)
    cell = torch.randint(0, 3, (n, 2), generator=g).float() - 1.0
    b = cell * 1.2 + 0.05 * torch.randn(n, 2, generator=g)
    return torch.stack([a, b], 1)  # [n, 2 domains, 2]


def pairs(size: int) -> dict:
    """pix2pix-style pairs, two fields of [1797, 3, size, size] in [-1, 1]: A the digit's
    outline (its morphological gradient, grey), B the digit coloured by its class."""
    d = digits(size)
    x = (d["images"][:, :1] + 1) / 2  # [N, 1, H, W] in [0, 1]
    outline = F.max_pool2d(x, 3, 1, 1) + F.max_pool2d(-x, 3, 1, 1)  # dilation - erosion
    hue = 2 * math.pi * d["labels"].float() / 10
    colour = torch.stack([torch.cos(hue), torch.cos(hue - 2.1), torch.cos(hue + 2.1)], 1) * 0.5 + 0.5
    a = outline.clamp(0, 1).expand(-1, 3, -1, -1)
    b = x * colour[:, :, None, None]
    return {"A": (a * 2 - 1).contiguous(), "B": (b * 2 - 1).contiguous()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=["digits", "ring", "two_domains", "pairs"])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--size", type=int, default=32)
    args = parser.parse_args()
    data = {"digits": lambda: digits(args.size), "ring": ring, "two_domains": two_domains,
            "pairs": lambda: pairs(args.size)}[args.name]()
    torch.save(data, args.output)
    if isinstance(data, dict) and "images" not in data:
        print(f"wrote {args.output}: fields " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in data.items()))
        return
    shape = tuple(data["images"].shape) if isinstance(data, dict) else tuple(data.shape)
    print(f"wrote {args.output}: {shape}" + (" with labels" if isinstance(data, dict) else ""))


if __name__ == "__main__":
    main()
