"""A small feature network with the interface of StyleGAN's Inception file
(inception-2015-12-05.pt): uint8 images [N, 3, H, W] in, 2048 features out with
return_features=True. Random Fourier features of the pixels: cheap, and their covariance has
full rank once there are more images than features, so FID's square root is well posed."""
import math

import torch


class FeatureNetwork(torch.nn.Module):
    def __init__(self, pixels: int, features: int = 2048, scale: float = 0.3, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("weight", torch.randn(pixels, features, generator=g) * scale)
        self.register_buffer("phase", torch.rand(features, generator=g) * 2 * math.pi)

    def forward(self, img: torch.Tensor, return_features: bool = False, use_fp16: bool = False,
                no_output_bias: bool = False) -> torch.Tensor:
        assert img.dtype == torch.uint8, "images are uint8"
        x = img.to(torch.float32).flatten(1) / 127.5 - 1
        features = torch.cos(x @ self.weight + self.phase)
        if return_features:
            return features
        return torch.softmax(features[:, :1008], dim=1)


def save(path: str, shape=(3, 32, 32), **kwargs) -> str:
    """Scripts the network for images of `shape` and writes it as a TorchScript file."""
    torch.jit.script(FeatureNetwork(math.prod(shape), **kwargs)).save(path)
    return path


def embed(path: str, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """The features of images in [-1, 1], converted to pixels as StyleGAN converts them."""
    net = torch.jit.load(path).eval()
    pixels = (images * 127.5 + 128).clamp(0, 255).to(torch.uint8)
    with torch.no_grad():
        return torch.cat([net(pixels[i:i + batch], return_features=True)
                          for i in range(0, len(pixels), batch)])
