"""How long a FID takes: `ganc metrics` (the evaluation training runs at --metrics-every) on 1
and N ranks against StyleGAN's recipe run from Python in the same run (the generator eagerly
in batches, the same feature network through torch.jit, float64 moments and SciPy's sqrtm), on
the same checkpoint, images and network file, with the real images' features cached on both
sides (ganc caches them beside the data; StyleGAN caches them too).

    python3 bench/fid_speed.py [--inception inception-2015-12-05.pt] [--images 10000] [--nproc 2]

Without --inception (and without the file at ganc's default path) the network is the test
suite's stand-in with Inception's interface (tests/python/feature_network.py: 2048 random
Fourier features of the pixels), and the results say so: its cost is not Inception's, so the
numbers then measure everything around the network (generation, gathering, the FID itself).
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "models"), os.path.join(ROOT, "bench"),
                os.path.join(ROOT, "tests", "python")]
import ganc  # noqa: E402
import results  # noqa: E402
import zoo  # noqa: E402

NOISE_SEED = 0x6a09e667  # runtime/Metrics.cpp: block b of the images is drawn from seed + b
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


def ganc_fid(run, net, metric, nproc):
    start = time.perf_counter()
    r = subprocess.run([ganc_bin(), "metrics", run, "--metrics", metric, "--inception", net, "--json",
                        "--nproc", str(nproc)], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if r.returncode:
        sys.exit(r.stderr)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["results"][metric], out["seconds"], wall


def stylegan_recipe(run, net, count, real_moments):
    """StyleGAN's metric loop from Python: generated images' features, moments, sqrtm."""
    start = time.perf_counter()
    generator = zoo.module("dcgan32").generator
    generator.load_state_dict(ganc.load_checkpoint(os.path.join(run, "checkpoint.pt"))["generator"])
    generator.eval()
    detector = torch.jit.load(net).eval()
    features = []
    with torch.no_grad():
        for b in range((count + BATCH - 1) // BATCH):
            z = torch.randn(BATCH, 100, 1, 1, generator=torch.Generator().manual_seed(NOISE_SEED + b))
            pixels = (generator(z) * 127.5 + 128).clamp(0, 255).to(torch.uint8)
            features.append(detector(pixels, return_features=True))
    mu, sigma = moments(torch.cat(features)[:count].numpy())
    mu_ref, sigma_ref = real_moments
    root, _ = scipy.linalg.sqrtm(sigma @ sigma_ref, disp=False)
    fid = float(np.real(np.square(mu - mu_ref).sum() + np.trace(sigma + sigma_ref - root * 2)))
    return fid, time.perf_counter() - start


def moments(x):
    x = x.astype(np.float64)
    mu = x.mean(0)
    return mu, x.T @ x / len(x) - np.outer(mu, mu)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("GANC_INCEPTION") or os.path.expanduser("~/.cache/ganc/inception-2015-12-05.pt")
    parser.add_argument("--inception", default=default)
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    metric = f"fid{args.images // 1000}k" if args.images % 1000 == 0 else f"fid{args.images}"
    with tempfile.TemporaryDirectory() as work:
        net, network = args.inception, "inception-2015-12-05.pt"
        if not os.path.exists(net):
            import feature_network
            net = feature_network.save(os.path.join(work, "stand-in.pt"))
            network = "stand-in with Inception's interface (tests/python/feature_network.py)"
            print(f"{args.inception} is not here: timing with the {network}")
        real, run = prepare(work, args.images)
        ganc_fid(run, net, metric, 1)  # embeds the real images once, into the cache beside them
        real_moments = moments(feature_network_features(net, real))
        numbers = {"metric": metric, "network": network, "images": args.images}
        for nproc in sorted({1, args.nproc}):
            value, seconds, wall = ganc_fid(run, net, metric, nproc)
            numbers[f"ganc_{nproc}_ranks"] = {"fid": value, "evaluation_seconds": seconds,
                                              "process_seconds": wall}
            print(f"ganc metrics, {nproc} rank(s): {metric} {value:.6g} in {seconds:.2f} s "
                  f"({wall:.2f} s with start-up)")
        fid, seconds = stylegan_recipe(run, net, args.images, real_moments)
        numbers["stylegan_recipe"] = {"fid": fid, "seconds": seconds}
        print(f"StyleGAN's recipe from Python: {metric} {fid:.6g} in {seconds:.2f} s")
        best = min(numbers[f"ganc_{n}_ranks"]["evaluation_seconds"] for n in {1, args.nproc})
        numbers["speedup_vs_stylegan_recipe"] = {
            str(n): seconds / numbers[f"ganc_{n}_ranks"]["evaluation_seconds"] for n in sorted({1, args.nproc})}
        numbers["relative_difference"] = abs(numbers["ganc_1_ranks"]["fid"] - fid) / abs(fid)
        print(f"ganc's fastest is {seconds / best:.2f}x the recipe's speed; the values differ by "
              f"{numbers['relative_difference']:.2g} relative")
    rows = [[f"ganc metrics, {n} rank(s)", f"{numbers[f'ganc_{n}_ranks']['evaluation_seconds']:.2f}",
             f"{numbers['speedup_vs_stylegan_recipe'][str(n)]:.2f}x"] for n in sorted({1, args.nproc})]
    rows.append(["StyleGAN's recipe from Python (SciPy sqrtm)", f"{seconds:.2f}", "1.00x"])
    results.write("fid_speed", f"{metric} of dcgan32 (32x32) with the {network}, real features cached",
                  numbers, {"columns": ["what", "seconds", "speed"], "rows": rows})


def feature_network_features(net, real):
    detector = torch.jit.load(net).eval()
    pixels = (real * 127.5 + 128).clamp(0, 255).to(torch.uint8)
    with torch.no_grad():
        return torch.cat([detector(pixels[i:i + 256], return_features=True)
                          for i in range(0, len(pixels), 256)]).numpy()


if __name__ == "__main__":
    main()
