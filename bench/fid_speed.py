"""How long a FID takes: `ganc metrics` (the evaluation training runs at --metrics-every) on 1
and N ranks against StyleGAN's recipe run from Python in the same run (the generator eagerly
in batches, the same feature network through torch.jit, float64 moments and SciPy's sqrtm) and
against torch-fidelity's `calculate_metrics` (its own generator loop and Inception module), on
the same checkpoint, real images and network weights, with the real images' features cached on
every side (ganc caches them beside the data; StyleGAN and torch-fidelity cache them too).

    python3 bench/fid_speed.py [--inception inception-2015-12-05.pt --fidelity-weights W.pth]
                               [--images 10000] [--nproc 2] [--standin inception|fourier]
                               [--device cpu|cuda]

Results: bench/results/fid_speed.json with the Inception file; fid_speed_standin_inception.json
or fid_speed_standin_fourier.json with a stand-in.

torch-fidelity's side needs `pip install torch-fidelity==0.4.0 torchvision==0.26.0` (the
torchvision of torch 2.11); without it that side is left out, with one line saying so. With
--inception, its weights are torch-fidelity's conversion of the same network
(weights-inception-2015-12-05-6726825d.pth, --fidelity-weights). Without the Inception file
(and without it at ganc's default path) the network is a stand-in, and the results say so:
`--standin inception` (the default where torch-fidelity is installed) is torch-fidelity's
InceptionV3, the same layers and cost as NVIDIA's file, with random weights, traced into a
TorchScript file with the file's interface for ganc and loaded from the same weights by
torch-fidelity; `--standin fourier` is the test suite's network
(tests/python/feature_network.py: 2048 random Fourier features of the pixels), whose cost is
not Inception's, so the numbers then measure everything around the network.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import scipy.linalg
import torch

import results  # noqa: E402  (first: the repository's python/ and models/ on sys.path)
from results import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import ganc  # noqa: E402
import zoo  # noqa: E402

NOISE_SEED = 0x6a09e667  # runtime/metrics/Metrics.cpp: block b of the images is drawn from seed + b
BATCH = 32               # dcgan32's batch: the generator runs a training batch at a time


def ganc_bin():
    path = os.path.join(os.environ.get("GANC_BUILD_DIR", os.path.join(ROOT, "build")), "tools", "ganc")
    if not os.path.exists(path):
        sys.exit(f"{path} is not built (bash scripts/setup.sh)")
    return path


def prepare(work, images):
    """dcgan32 trained one step on `images` smooth random images; the run directory."""
    g = torch.Generator().manual_seed(0)
    real = torch.nn.functional.interpolate(torch.rand(images, 3, 8, 8, generator=g), size=(32, 32),
                                           mode="bilinear") * 2 - 1
    data = os.path.join(work, "real.pt")
    torch.save(real, data)
    gan, spec = zoo.build("dcgan32")
    model = os.path.join(work, "dcgan32.pt")
    ganc.export(gan, model, spec, verbose=False)
    plan = os.path.join(work, "dcgan32.plan")
    subprocess.run([ganc_bin(), "compile", model, "-o", plan], check=True, stdout=subprocess.DEVNULL)
    run = os.path.join(work, "run")
    subprocess.run([ganc_bin(), "train", plan, "--model", model, "--data", data, "--steps", "1", "--out", run,
                    "--tensorboard", "off", "--sample-every", "0"], check=True, stdout=subprocess.DEVNULL)
    return real, run


def ganc_fid(run, net, metric, nproc, device):
    start = time.perf_counter()
    r = subprocess.run([ganc_bin(), "metrics", run, "--metrics", metric, "--inception", net, "--json",
                        "--nproc", str(nproc), "--device", device], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if r.returncode:
        sys.exit(r.stderr)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["results"][metric], out["seconds"], wall


def stylegan_recipe(run, net, count, real_moments, device):
    """StyleGAN's metric loop from Python: generated images' features, moments, sqrtm."""
    start = time.perf_counter()
    generator = zoo.module("dcgan32").generator
    generator.load_state_dict(ganc.load_checkpoint(os.path.join(run, "checkpoint.pt"))["generator"])
    generator.eval().to(device)
    detector = torch.jit.load(net, map_location=device).eval()
    features = []
    with torch.no_grad():
        for b in range((count + BATCH - 1) // BATCH):
            z = torch.randn(BATCH, 100, 1, 1, generator=torch.Generator().manual_seed(NOISE_SEED + b)).to(device)
            pixels = (generator(z) * 127.5 + 128).clamp(0, 255).to(torch.uint8)
            features.append(detector(pixels, return_features=True).cpu())
    mu, sigma = moments(torch.cat(features)[:count].numpy())
    mu_ref, sigma_ref = real_moments
    root, _ = scipy.linalg.sqrtm(sigma @ sigma_ref, disp=False)
    fid = float(np.real(np.square(mu - mu_ref).sum() + np.trace(sigma + sigma_ref - root * 2)))
    return fid, time.perf_counter() - start


class InceptionFile(torch.nn.Module):
    """A traced InceptionV3 behind the interface of NVIDIA's file: uint8 images in, the 2048
    pool features with return_features=True (the fc layer's logits are not needed here)."""

    def __init__(self, traced):
        super().__init__()
        self.net = traced

    def forward(self, img: torch.Tensor, return_features: bool = False, use_fp16: bool = False,
                no_output_bias: bool = False) -> torch.Tensor:
        return self.net(img)


def inception_standin(work, size):
    """torch-fidelity's InceptionV3 with random weights: (TorchScript file for ganc, the
    weights file torch-fidelity loads)."""
    from torch_fidelity import feature_extractor_inceptionv3 as tf_inception
    # Built without its download: no weights fetched, the layers' random initialisation kept.
    fetch, load = tf_inception.load_state_dict_from_url, tf_inception.FeatureExtractorInceptionV3.load_state_dict
    tf_inception.load_state_dict_from_url = lambda *args, **kwargs: {}
    tf_inception.FeatureExtractorInceptionV3.load_state_dict = lambda self, state: None
    try:
        torch.manual_seed(0)
        net = tf_inception.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    finally:
        tf_inception.load_state_dict_from_url = fetch
        tf_inception.FeatureExtractorInceptionV3.load_state_dict = load
    # Batch-norm statistics of one batch of random images (the statistics of a train-mode pass,
    # layer by layer), so that the features are of order one as a trained network's are, not
    # vanishing through 90 randomly initialised layers.
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    net.train()
    with torch.no_grad():
        net(torch.randint(0, 256, (64, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)))
    net.eval()
    weights = os.path.join(work, "standin-weights.pth")
    torch.save(net.state_dict(), weights)

    class Features(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = net

        def forward(self, img):
            return self.inner(img)[0]

    example = torch.randint(0, 256, (2, 3, size, size), dtype=torch.uint8)
    with torch.no_grad():
        traced = torch.jit.trace(Features().eval(), example, check_trace=False)
    path = os.path.join(work, "standin-inception.pt")
    torch.jit.script(InceptionFile(traced)).save(path)
    return path, weights


def fidelity_fid(run, weights, real, count, work, device):
    """torch-fidelity's calculate_metrics: the generator through its module wrapper (its own
    noise), the real images as a dataset, their statistics cached by name. Returns the FID,
    the seconds of the first call (which embeds the real images) and of the second (cached)."""
    import torch_fidelity

    generator = zoo.module("dcgan32").generator
    generator.load_state_dict(ganc.load_checkpoint(os.path.join(run, "checkpoint.pt"))["generator"])

    class Pixels(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.g = generator

        def forward(self, z):
            return (self.g(z[:, :, None, None]) * 127.5 + 128).clamp(0, 255).to(torch.uint8)

    class Real(torch.utils.data.Dataset):
        def __init__(self):
            self.pixels = (real * 127.5 + 128).clamp(0, 255).to(torch.uint8)

        def __len__(self):
            return len(self.pixels)

        def __getitem__(self, i):
            return self.pixels[i]

    model = torch_fidelity.GenerativeModelModuleWrapper(Pixels(), 100, "normal", 0)
    kwargs = dict(input1=model, input1_model_num_samples=count, input2=Real(), input2_cache_name="ganc_bench_real",
                  cache_root=os.path.join(work, "fidelity-cache"), fid=True, verbose=False, cuda=device == "cuda",
                  feature_extractor="inception-v3-compat", feature_extractor_weights_path=weights)
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        fid = torch_fidelity.calculate_metrics(**kwargs)["frechet_inception_distance"]
        seconds.append(time.perf_counter() - start)
    return float(fid), seconds[0], seconds[1]


def have_fidelity():
    try:
        import torch_fidelity  # noqa: F401
        import torchvision  # noqa: F401
        return True
    except ImportError:
        return False


def moments(x):
    x = x.astype(np.float64)
    mu = x.mean(0)
    return mu, x.T @ x / len(x) - np.outer(mu, mu)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("GANC_INCEPTION") or os.path.expanduser("~/.cache/ganc/inception-2015-12-05.pt")
    parser.add_argument("--inception", default=default)
    parser.add_argument("--fidelity-weights", help="torch-fidelity's weights of the --inception network")
    parser.add_argument("--standin", choices=["inception", "fourier"],
                        help="the network without the Inception file (default: inception where "
                             "torch-fidelity is installed, else fourier)")
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where ganc, the recipe and torch-fidelity run (one GPU: --nproc 1)")
    args = parser.parse_args()
    fidelity = have_fidelity()
    if not fidelity:
        print("torch-fidelity is not installed (pip install torch-fidelity==0.4.0 torchvision==0.26.0): "
              "its side is left out")
    standin = args.standin or ("inception" if fidelity else "fourier")
    if standin == "inception" and not fidelity:
        sys.exit("fid_speed: --standin inception builds torch-fidelity's InceptionV3: pip install "
                 "torch-fidelity==0.4.0 torchvision==0.26.0")
    metric = f"fid{args.images // 1000}k" if args.images % 1000 == 0 else f"fid{args.images}"
    with tempfile.TemporaryDirectory() as work:
        net, network, weights = args.inception, "inception-2015-12-05.pt", args.fidelity_weights
        result_name = "fid_speed"  # bench/results/: one file per network
        if not os.path.exists(net):
            result_name = f"fid_speed_standin_{standin}"
            print(f"{args.inception} is not here: timing with a stand-in")
            if standin == "inception":
                net, weights = inception_standin(work, 32)
                network = ("stand-in: torch-fidelity's InceptionV3 (Inception's layers and cost) with random "
                           "weights, traced for ganc, the same weights in torch-fidelity")
            else:
                import feature_network
                net, weights = feature_network.save(os.path.join(work, "stand-in.pt")), None
                network = "stand-in with Inception's interface (tests/python/feature_network.py)"
        real, run = prepare(work, args.images)
        ganc_fid(run, net, metric, 1, args.device)  # embeds the real images once, into the cache beside them
        real_moments = moments(feature_network_features(net, real, args.device))
        numbers = {"metric": metric, "network": network, "images": args.images,
                   "torch_threads": torch.get_num_threads()}
        sides = [("stylegan_recipe", "StyleGAN's recipe from Python (SciPy sqrtm)")]
        for nproc in sorted({1, args.nproc}):
            value, seconds, wall = ganc_fid(run, net, metric, nproc, args.device)
            numbers[f"ganc_{nproc}_ranks"] = {"fid": value, "evaluation_seconds": seconds,
                                              "process_seconds": wall}
            print(f"ganc metrics, {nproc} rank(s): {metric} {value:.6g} in {seconds:.2f} s "
                  f"({wall:.2f} s with start-up)")
        fid, seconds = stylegan_recipe(run, net, args.images, real_moments, args.device)
        numbers["stylegan_recipe"] = {"fid": fid, "seconds": seconds}
        print(f"StyleGAN's recipe from Python: {metric} {fid:.6g} in {seconds:.2f} s")
        if fidelity and weights:
            value, first, cached = fidelity_fid(run, weights, real, args.images, work, args.device)
            numbers["torch_fidelity"] = {"fid": value, "seconds": cached, "first_call_seconds": first,
                                         "note": "its own noise (other generated images): the value is "
                                                 "not expected to equal ganc's"}
            sides.append(("torch_fidelity", "torch-fidelity 0.4.0 calculate_metrics (real statistics cached)"))
            print(f"torch-fidelity: {metric} {value:.6g} in {cached:.2f} s ({first:.2f} s embedding the "
                  f"real images too)")
        elif fidelity:
            print("torch-fidelity's side needs --fidelity-weights with --inception: left out")
        ranks = sorted({1, args.nproc})
        numbers["relative_difference"] = abs(numbers["ganc_1_ranks"]["fid"] - fid) / abs(fid)
        rows = []
        for key, label in sides:
            base = numbers[key]["seconds"]
            numbers[f"speedup_vs_{key}"] = {str(n): base / numbers[f"ganc_{n}_ranks"]["evaluation_seconds"]
                                            for n in ranks}
            print(f"ganc against {label}: " + ", ".join(
                f"{numbers[f'speedup_vs_{key}'][str(n)]:.2f}x at {n} rank(s)" for n in ranks))
        print(f"ganc's and StyleGAN's values differ by {numbers['relative_difference']:.2g} relative")
    for n in ranks:
        rows.append([f"ganc metrics, {n} rank(s)", f"{numbers[f'ganc_{n}_ranks']['evaluation_seconds']:.2f}"]
                    + [f"{numbers[f'speedup_vs_{key}'][str(n)]:.2f}x" for key, _ in sides])
    for key, label in sides:
        rows.append([label, f"{numbers[key]['seconds']:.2f}"] + ["" for _ in sides])
    results.write(result_name, f"{metric} of dcgan32 (32x32) with the {network}, real features cached",
                  numbers, {"columns": ["what", "seconds"] + [f"ganc's speed against {label}" for _, label in sides],
                            "rows": rows})


def feature_network_features(net, real, device):
    detector = torch.jit.load(net, map_location=device).eval()
    pixels = (real * 127.5 + 128).clamp(0, 255).to(torch.uint8)
    with torch.no_grad():
        return torch.cat([detector(pixels[i:i + 256].to(device), return_features=True).cpu()
                          for i in range(0, len(pixels), 256)]).numpy()


if __name__ == "__main__":
    main()
