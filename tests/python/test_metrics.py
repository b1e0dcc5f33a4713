"""FID and KID during training (--metrics) and of a finished run (ganc metrics), against
SciPy's sqrtm-based FID and StyleGAN's KID computed here on the features the run used, with a
feature network of Inception's interface made in the test (feature_network.py)."""
import json
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import scipy.linalg
import torch

import feature_network
import ganc
import zoo
from conftest import archive, compile_plan, train_args

# More images than features (2048): both covariances have full rank. 82 batches of 32.
IMAGES = 2624
NOISE_SEED = 0x6a09e667  # runtime/metrics/Metrics.cpp: block b of the images is drawn from seed + b


@pytest.fixture(scope="module")
def setup(ganc_bin, tmp_path_factory):
    work = tmp_path_factory.mktemp("metrics")
    g = torch.Generator().manual_seed(0)
    real = torch.nn.functional.interpolate(torch.rand(IMAGES, 3, 8, 8, generator=g), size=(32, 32),
                                           mode="bilinear") * 2 - 1
    data = str(work / "real.pt")
    torch.save(real, data)
    return {"work": work, "data": data, "real": real,
            "net": feature_network.save(str(work / "inception.pt")),
            "plan": compile_plan(ganc_bin, "dcgan32", str(work))}


def styleganFid(generated, real):
    """StyleGAN's FID (metrics/frechet_inception_distance.py): float64 raw moments, SciPy's sqrtm."""
    def moments(x):
        x = x.astype(np.float64)
        mu = x.mean(0)
        return mu, x.T @ x / len(x) - np.outer(mu, mu)
    mu, sigma = moments(generated)
    mu_ref, sigma_ref = moments(real)
    root, _ = scipy.linalg.sqrtm(sigma @ sigma_ref, disp=False)
    return float(np.real(np.square(mu - mu_ref).sum() + np.trace(sigma + sigma_ref - root * 2)))


def styleganKid(generated, real, num_subsets, max_subset_size=1000):
    """StyleGAN's KID (metrics/kernel_inception_distance.py), in float64."""
    generated, real = generated.astype(np.float64), real.astype(np.float64)
    n = real.shape[1]
    m = min(min(real.shape[0], generated.shape[0]), max_subset_size)
    t = 0
    for _ in range(num_subsets):
        x = generated[np.random.choice(generated.shape[0], m, replace=False)]
        y = real[np.random.choice(real.shape[0], m, replace=False)]
        a = (x @ x.T / n + 1) ** 3 + (y @ y.T / n + 1) ** 3
        b = (x @ y.T / n + 1) ** 3
        t += (a.sum() - np.diag(a).sum()) / (m - 1) - b.sum() * 2 / m
    return float(t / num_subsets / m)


def metrics_log(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def train(ganc_bin, setup, out, steps, *extra, nproc=1):
    return subprocess.run([ganc_bin, "run", "--nproc", str(nproc),
                           *train_args(setup["plan"], "dcgan32", setup["data"], out, steps,
                                       "--inception", setup["net"], "--tensorboard", "off", *extra)],
                          capture_output=True, text=True)


def score(ganc_bin, target, setup, *extra):
    r = subprocess.run([ganc_bin, "metrics", target, "--inception", setup["net"], "--json", *extra],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_fid_and_kid_equal_the_reference_formulas(ganc_bin, setup):
    out, dump = str(setup["work"] / "one"), str(setup["work"] / "dump")
    r = train(ganc_bin, setup, out, 2, "--metrics", f"fid{IMAGES},kid1000", "--dump-grads", dump)
    assert r.returncode == 0, r.stderr
    assert f"embedding {IMAGES} real images" in r.stdout
    [entry] = metrics_log(out)
    assert entry["step"] == 2 and entry["kimg"] == 0.064 and entry["best"]
    got = entry["results"]
    assert re.search(rf"metrics at step 2 \(0.064 kimg\):  fid{IMAGES} \S+  kid1000 \S+", r.stdout)
    stats = [json.loads(line) for line in open(os.path.join(out, "stats.jsonl"))]
    assert [s[f"Metrics/fid{IMAGES}"] for s in stats if f"Metrics/fid{IMAGES}" in s] == [got[f"fid{IMAGES}"]]

    features = ganc.load_checkpoint(os.path.join(dump, "metrics_step2.pt"))
    # The real features are the network's on the data set's images, as pixels.
    real = feature_network.embed(setup["net"], setup["real"])
    assert torch.equal(features[f"fid{IMAGES}/real"], real)
    assert torch.equal(features["kid1000/real"], real[:1000])
    # The generated ones are the trained generator's (eval mode) on the metrics' noise.
    generator = zoo.module("dcgan32").generator
    ckpt = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))
    generator.load_state_dict(ckpt["generator"])
    generator.eval()
    with torch.no_grad():
        images = torch.cat([generator(torch.randn(32, 100, 1, 1, generator=torch.Generator().manual_seed(NOISE_SEED + b)))
                            for b in range(IMAGES // 32)])
    torch.testing.assert_close(features[f"fid{IMAGES}/generated"],
                               feature_network.embed(setup["net"], images), rtol=0, atol=1e-4)

    fid = styleganFid(features[f"fid{IMAGES}/generated"].numpy(), features[f"fid{IMAGES}/real"].numpy())
    assert got[f"fid{IMAGES}"] == pytest.approx(fid, rel=1e-6)
    # 1000 of each: every subset of StyleGAN's is the whole of both, and gives the same value.
    kid = styleganKid(features["kid1000/generated"].numpy(), features["kid1000/real"].numpy(), num_subsets=2)
    assert got["kid1000"] == pytest.approx(kid, rel=1e-6)
    # The last step's snapshot is the best (the only one scored) and scores the same again.
    best = ganc.load_checkpoint(os.path.join(out, "checkpoint-best.pt"))
    network = best["best"]["network"]
    assert re.fullmatch("[0-9a-f]{16}", network), network
    assert best["step"] == 2 and best["best"] == {"metric": f"fid{IMAGES}", "value": got[f"fid{IMAGES}"], "step": 2,
                                                  "network": network}
    again = score(ganc_bin, out, setup, "--metrics", f"fid{IMAGES},kid1000")
    assert again["step"] == 2 and again["results"] == pytest.approx(got, rel=1e-9)


def test_a_run_is_scored_from_anywhere_and_against_other_data(ganc_bin, setup):
    """A run trained with paths relative to its directory is scored from another directory
    (run.json kept them relative: the plan was not found), and `ganc metrics RUN --data other`
    scores against other real images, as documented (it was refused as a resume change)."""
    work = setup["work"]
    r = subprocess.run([ganc_bin, "train", *train_args(os.path.relpath(setup["plan"], work), "dcgan32",
                                                      os.path.relpath(setup["data"], work), "relative", 1,
                                                      "--tensorboard", "off")],
                       capture_output=True, text=True, cwd=work)
    assert r.returncode == 0, r.stderr
    record = json.loads((work / "relative" / "run.json").read_text())
    assert all(os.path.isabs(record[key]) for key in ("plan", "model", "data")), record
    other = str(work / "other.pt")
    torch.save(-setup["real"], other)
    out = str(work / "relative")
    scored = {}
    for data in (None, other):
        r = subprocess.run([ganc_bin, "metrics", out, "--inception", setup["net"], "--json", "--metrics", "fid100",
                            *(["--data", data] if data else [])], capture_output=True, text=True, cwd="/")
        assert r.returncode == 0, r.stderr
        scored[data] = json.loads(r.stdout.strip().splitlines()[-1])["results"]["fid100"]
    assert scored[None] != scored[other]


def test_every_rank_embeds_its_share_and_the_best_snapshot_is_kept(ganc_bin, setup):
    out = str(setup["work"] / "two")
    # 64 images a step over both ranks: scored at steps 2 and 4 (and at 5, the last).
    r = train(ganc_bin, setup, out, 5, "--metrics", f"fid{IMAGES}", "--metrics-every", "0.128",
              "--checkpoint-every", "4", nproc=2)
    assert r.returncode == 0, r.stderr
    # The real features were cached beside the data by the first test's run.
    assert "metrics: the real images' features: " + setup["data"] + ".ganc-cache/" in r.stdout
    assert "embedding" not in r.stdout
    log = metrics_log(out)
    assert [(e["step"], e["kimg"]) for e in log] == [(2, 0.128), (4, 0.256), (5, 0.32)]
    values = [e["results"][f"fid{IMAGES}"] for e in log]
    best_step = log[int(np.argmin(values))]["step"]
    assert [e["best"] for e in log] == [v == min(values[:i + 1]) for i, v in enumerate(values)]
    best = ganc.load_checkpoint(os.path.join(out, "checkpoint-best.pt"))
    assert best["step"] == best_step and best["best"]["value"] == min(values)
    # A snapshot scored afterwards, on one rank or two, as training scored it.
    for nproc in ("1", "2"):
        again = score(ganc_bin, os.path.join(out, "checkpoint-best.pt"), setup, "--metrics", f"fid{IMAGES}",
                      "--nproc", nproc)
        assert again["step"] == best_step
        assert again["results"][f"fid{IMAGES}"] == pytest.approx(min(values), rel=1e-6)
    # Resumed at step 4: the rows after it are dropped and written again, exactly; the ranking
    # goes on from the checkpoint's record of the best.
    straight = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["best"]
    assert ganc.load_checkpoint(os.path.join(out, "checkpoint-0000004.pt"))["best"] == {
        "metric": f"fid{IMAGES}", "value": min(values[:2]), "step": log[int(np.argmin(values[:2]))]["step"],
        "network": straight["network"]}
    r = train(ganc_bin, setup, out, 5, "--metrics", f"fid{IMAGES}", "--metrics-every", "0.128",
              "--checkpoint-every", "4", "--resume", os.path.join(out, "checkpoint-0000004.pt"), nproc=2)
    assert r.returncode == 0, r.stderr
    resumed = metrics_log(out)
    assert [e["step"] for e in resumed] == [2, 4, 5] and resumed[:2] == log[:2]
    assert resumed[2]["results"] == log[2]["results"] and resumed[2]["best"] == log[2]["best"]
    assert ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["best"] == straight


def test_the_cache_follows_the_data(ganc_bin, setup):
    changed = setup["real"].clone()
    changed[7, 0, 3, 3] = 0.5
    data = str(setup["work"] / "changed.pt")
    torch.save(changed, data)
    cache = data + ".ganc-cache"
    out = str(setup["work"] / "changed")
    args = ["--metrics", "fid2000", "--data", data]
    r = train(ganc_bin, setup, out, 1, *args)
    assert r.returncode == 0, r.stderr
    assert "embedding 2000 real images" in r.stdout
    [name] = os.listdir(cache)
    # A damaged cache file is computed again, not trusted.
    with open(os.path.join(cache, name), "r+b") as f:
        f.truncate(100)
    r = train(ganc_bin, setup, out, 1, *args, "--force")
    assert r.returncode == 0, r.stderr
    assert "embedding 2000 real images" in r.stdout
    r = train(ganc_bin, setup, out, 1, *args, "--force")
    assert "the real images' features: " + os.path.join(cache, name) in r.stdout
    shutil.rmtree(cache)


@pytest.mark.parametrize("extra,message", [
    (["--metrics", "fid"], "--metrics: 'fid' is not a metric: fidN or kidN"),
    (["--metrics-every", "10"], "--metrics-every sets how --metrics run: give --metrics too"),
    (["--metrics", "fid1k", "--inception", "/nowhere/inception.pt"],
     "--metrics needs the Inception network (inception-2015-12-05.pt), and /nowhere/inception.pt does "
     "not exist: put the file there or give --inception PATH; NVIDIA publishes it at https://"),
    (["--metrics", "fid1k", "--inception", "NOT_TORCHSCRIPT"], "not a TorchScript file"),
])
def test_refusals_before_training(ganc_bin, setup, extra, message):
    bad = setup["work"] / "garbage.pt"
    bad.write_bytes(b"not a network")
    extra = [str(bad) if e == "NOT_TORCHSCRIPT" else e for e in extra]
    out = str(setup["work"] / "refused")
    r = subprocess.run([ganc_bin, "train", *train_args(setup["plan"], "dcgan32", setup["data"], out, 2,
                                                       "--tensorboard", "off", "--force", *extra)],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "step " not in r.stdout and not os.path.exists(os.path.join(out, "checkpoint.pt"))


def test_a_damaged_run_is_one_line_naming_what(ganc_bin, setup):
    """`ganc metrics` on a run whose checkpoint is truncated: one line naming the checkpoint
    as ganc metrics' (it said "--resume", an option the user never gave). On a run whose
    run.json is not the shape ganc writes: one line naming the field, exit 2 (it once aborted
    with an uncaught JSON type error, exit 134)."""
    out = str(setup["work"] / "reshaped")
    r = train(ganc_bin, setup, out, 1, "--force", "--metrics", "fid100")
    assert r.returncode == 0, r.stderr
    checkpoint = os.path.join(out, "checkpoint.pt")
    whole = open(checkpoint, "rb").read()
    with open(checkpoint, "wb") as f:
        f.write(whole[:len(whole) // 2])
    r = subprocess.run([ganc_bin, "metrics", out, "--inception", setup["net"], "--metrics", "fid100"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"metrics: the checkpoint {checkpoint}: not a zip archive" in r.stderr and "--resume" not in r.stderr
    with open(checkpoint, "wb") as f:
        f.write(whole)
    for record, says in (("[1, 2]", "it is not a JSON object"),
                         ('{"plan": 3}', "'plan' is not a string"),
                         ('{"options": []}', "'options' is not an object"),
                         ('{"options": {"seed": -1}}', "'options.seed' is not a non-negative integer")):
        with open(os.path.join(out, "run.json"), "w") as f:
            f.write(record)
        r = subprocess.run([ganc_bin, "metrics", out, "--inception", setup["net"], "--metrics", "fid100"],
                           capture_output=True, text=True)
        assert r.returncode == 2, (record, r.returncode, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"run.json is not a run record ganc wrote: {says}" in r.stderr, r.stderr


class _SpoilsAfter(torch.nn.Module):
    """The test's feature network, whose features turn NaN after its first `good` calls."""

    def __init__(self, pixels: int, good: int):
        super().__init__()
        self.net = feature_network.FeatureNetwork(pixels)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.good = good

    def forward(self, img: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        self.calls += 1
        features = self.net(img, return_features)
        if bool(self.calls > self.good):
            features = features * float("nan")
        return features


def test_scores_that_are_not_numbers_never_rank_and_stop_after_the_checkpoint(ganc_bin, setup):
    """Features that are not finite (a network that gives NaN, a cache file holding NaN) stop
    the run in one line naming the network or the cache file, after the step's checkpoint is
    written; a best score that is not a number (an older checkpoint's) is replaced by the next
    finite one; an FID over fewer images than features says it is not defined there."""
    spoiled = str(setup["work"] / "spoiled.pt")
    torch.jit.script(_SpoilsAfter(3 * 32 * 32, good=1)).save(spoiled)  # the check at start-up
    out = str(setup["work"] / "nan")
    r = subprocess.run([ganc_bin, "run", "--nproc", "2",
                        *train_args(setup["plan"], "dcgan32", setup["data"], out, 4, "--inception", spoiled,
                                    "--tensorboard", "off", "--metrics", "fid100", "--metrics-every", "0.064",
                                    "--checkpoint-every", "100")], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    said = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(said) == 1 and f"metrics: the feature network {spoiled} gave NaN or inf features for the real " \
        "images" in said[0] and "step 1, checkpoint.pt written at it" in said[0], r.stderr
    assert ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["step"] == 1

    # A cache file holding NaN (from a network that once gave it) is named, not scored.
    first = str(setup["work"] / "cached")
    r = train(ganc_bin, setup, first, 1, "--metrics", "fid100")
    assert r.returncode == 0 and "warning: --metrics fid100: 100 real images, fewer than the network's 2048 " \
        "features: their covariance is singular and FID is not well defined there" in r.stderr, r.stderr
    [cache] = re.findall(r"cached next time in (\S+)\)", r.stdout) or re.findall(r"features: (\S+)", r.stdout)
    features = torch.load(cache)
    torch.save(torch.full_like(features, float("nan")), cache)
    r = train(ganc_bin, setup, first, 1, "--metrics", "fid100", "--force")
    assert r.returncode == 1 and f"the cached real features {cache} hold NaN or inf values" in r.stderr, r.stderr
    os.remove(cache)

    # A best score that is not a number, as an older ganc kept it, ranks below any number.
    r = train(ganc_bin, setup, first, 2, "--metrics", "fid100", "--force", "--checkpoint-every", "1")
    assert r.returncode == 0, r.stderr
    ckpt = torch.load(os.path.join(first, "checkpoint.pt"), weights_only=False)
    assert ckpt["step"] == 2 and ckpt["best"]["step"] == 2
    ckpt["best"]["value"] = float("nan")
    edited = os.path.join(str(setup["work"]), "nan-best.pt")
    torch.save(ckpt, edited)
    r = train(ganc_bin, setup, str(setup["work"] / "nan-best"), 3, "--metrics", "fid100", "--resume", edited)
    assert r.returncode == 0, r.stderr
    log = metrics_log(str(setup["work"] / "nan-best"))
    assert [(e["step"], e["best"]) for e in log] == [(3, True)], log
    assert ganc.load_checkpoint(str(setup["work"] / "nan-best" / "checkpoint-best.pt"))["step"] == 3


def test_scores_of_another_feature_network_do_not_rank_against_the_runs(ganc_bin, setup):
    """A resume with another --inception ranked the new network's scores against the old one's
    (an FID of 0.06 "beat" 301 and replaced checkpoint-best.pt). The best is kept per network:
    the first score of the new one starts the ranking afresh, and the run says so."""
    out = str(setup["work"] / "renetworked")
    r = train(ganc_bin, setup, out, 2, "--metrics", "fid100", "--checkpoint-every", "1")
    assert r.returncode == 0, r.stderr
    first = ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["best"]
    other = feature_network.save(str(setup["work"] / "other-inception.pt"), seed=7, scale=3.0)
    r = subprocess.run([ganc_bin, "run", "--nproc", "1",
                        *train_args(setup["plan"], "dcgan32", setup["data"], out, 3, "--inception", other,
                                    "--tensorboard", "off", "--metrics", "fid100", "--checkpoint-every", "1",
                                    "--resume", "auto")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "the checkpoint's best snapshot was scored by another feature network than --inception " + other \
        in r.stdout, r.stdout
    best = ganc.load_checkpoint(os.path.join(out, "checkpoint-best.pt"))
    assert best["step"] == 3 and best["best"]["network"] != first["network"], best["best"]
    assert metrics_log(out)[-1]["best"]


def test_a_stop_during_an_evaluation_keeps_the_steps(ganc_bin, setup):
    """SIGTERM while the ranks score 50k images (longer than the launcher's minute of grace):
    the evaluation is abandoned on every rank at its next block, the step's checkpoint is
    written and the run stops with 143; it was killed after the grace with no checkpoint."""
    import signal
    import time
    out = str(setup["work"] / "stopped")
    featured = train(ganc_bin, setup, str(setup["work"] / "cache"), 1, "--metrics", f"fid{IMAGES}")
    assert featured.returncode == 0, featured.stderr  # the real features are cached
    proc = subprocess.Popen([ganc_bin, "run", "--nproc", "2",
                             *train_args(setup["plan"], "dcgan32", setup["data"], out, 10, "--inception",
                                         setup["net"], "--tensorboard", "off", "--metrics", "fid50k",
                                         "--metrics-every", "0.064", "--checkpoint-every", "100")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in proc.stdout:
        if line.startswith("metrics: the real images' features"):
            break
    started = time.time()
    os.killpg(proc.pid, signal.SIGTERM)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert time.time() - started < 30, "the evaluation ran on after the stop"
    assert "metrics at step 1: abandoned part way (SIGTERM); no score is kept" in rest, rest
    assert "stopped after step 1 of 10" in err, err
    assert ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["step"] == 1
    assert not os.path.exists(os.path.join(out, "metrics.jsonl")) or metrics_log(out) == []


class _IntegerFeatures(torch.nn.Module):
    """The test's feature network, returning its features as int64."""

    def __init__(self, pixels: int):
        super().__init__()
        self.net = feature_network.FeatureNetwork(pixels)

    def forward(self, img: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        return (self.net(img, return_features) * 100).long()


def test_a_network_with_integer_features_is_refused_by_what_it_returned(ganc_bin, setup):
    """A feature network that returns int64 features is refused before training naming the
    type (the line said only their shape, which was right)."""
    net = str(setup["work"] / "integer.pt")
    torch.jit.script(_IntegerFeatures(3 * 32 * 32)).save(net)
    r = subprocess.run([ganc_bin, "train", *train_args(setup["plan"], "dcgan32", setup["data"],
                                                       str(setup["work"] / "integer"), 2, "--inception", net,
                                                       "--metrics", "fid100", "--tensorboard", "off")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"--inception {net}: it returned long int features (FID's moments need floating-point features)" \
        in r.stderr, r.stderr


def test_stylegans_g_of_z_and_c_is_scored_through_the_recipes_sample_method(ganc_bin, tmp_path):
    """NVIDIA's G(z, c), whose c has no default, is sampled through the recipe's method
    (`sample_grid(z)`, G_ema(z, c) with c of no classes): --metrics calls it on the metrics'
    noise and scores its images (it was refused: 'the spec's sample calls method ...'). The
    generated features are the trained G_ema's on that noise, and FID is StyleGAN's formula on
    them."""
    from ganc import recipes
    from test_recipes import AdaG, TinyD
    torch.manual_seed(0)
    gan, spec = recipes.stylegan2(AdaG(), TinyD(), cfg="auto", gpus=1, batch=8, gamma=1.0)
    assert spec["sample"] == {"method": "sample_grid", "inputs": [{"name": "z", "source": "normal", "shape": [8]}]}
    model, plan = str(tmp_path / "sg.pt"), str(tmp_path / "sg.plan")
    ganc.export(gan, model, spec, verbose=False)
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    real = torch.rand(160, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    data, net = str(tmp_path / "real.pt"), feature_network.save(str(tmp_path / "net.pt"), shape=(3, 16, 16))
    torch.save(real, data)
    out, dump = str(tmp_path / "run"), str(tmp_path / "dump")
    r = subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", data, "--steps", "2", "--out", out,
                        "--sample-every", "0", "--checkpoint-every", "2", "--tensorboard", "off", "--metrics", "fid64",
                        "--inception", net, "--dump-grads", dump], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    [entry] = metrics_log(out)
    features = ganc.load_checkpoint(os.path.join(dump, "metrics_step2.pt"))
    G_ema = AdaG()
    G_ema.load_state_dict(ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["G_ema"])
    G_ema.eval()
    with torch.no_grad():
        images = torch.cat([G_ema(torch.randn(8, 8, generator=torch.Generator().manual_seed(NOISE_SEED + b)),
                                  torch.zeros(8, 0)) for b in range(64 // 8)])
    torch.testing.assert_close(features["fid64/generated"], feature_network.embed(net, images), rtol=0, atol=1e-4)
    fid = styleganFid(features["fid64/generated"].numpy(), features["fid64/real"].numpy())
    assert entry["results"]["fid64"] == pytest.approx(fid, rel=1e-6)


def test_a_conditional_g_is_scored_on_classes_drawn_from_the_datas_labels(ganc_bin, digits16, tmp_path):
    """A conditional G(z, c) through the recipe's `sample_grid_c(z, labels)`: the metrics draw
    each image's class as NVIDIA's metrics draw c, the label of a random sample of the data set
    (from the block's generator, after its noise), and the generated features are the trained
    G_ema's on that noise and those one-hot classes."""
    from ganc import recipes
    from test_recipes import AdaG, TinyD
    torch.manual_seed(0)
    gan, spec = recipes.stylegan2(AdaG(c_dim=10), TinyD(), cfg="auto", gpus=1, batch=8, gamma=1.0)
    assert spec["sample"]["method"] == "sample_grid_c"
    model, plan = str(tmp_path / "sgc.pt"), str(tmp_path / "sgc.plan")
    ganc.export(gan, model, spec, verbose=False)
    subprocess.run([ganc_bin, "compile", model, "-o", plan], check=True, capture_output=True)
    net = feature_network.save(str(tmp_path / "net.pt"), shape=(3, 16, 16))
    out, dump = str(tmp_path / "run"), str(tmp_path / "dump")
    r = subprocess.run([ganc_bin, "train", plan, "--model", model, "--data", digits16, "--steps", "2", "--out", out,
                        "--sample-every", "0", "--checkpoint-every", "2", "--tensorboard", "off", "--metrics", "fid64",
                        "--inception", net, "--dump-grads", dump], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    labels = torch.load(digits16)["labels"]
    G_ema = AdaG(c_dim=10)
    G_ema.load_state_dict(ganc.load_checkpoint(os.path.join(out, "checkpoint.pt"))["G_ema"])
    G_ema.eval()
    images = []
    with torch.no_grad():
        for b in range(64 // 8):
            g = torch.Generator().manual_seed(NOISE_SEED + b)
            z = torch.randn(8, 8, generator=g)
            c = labels[torch.randint(len(labels), (8,), generator=g)]
            images.append(G_ema(z, torch.nn.functional.one_hot(c, 10).float()))
    features = ganc.load_checkpoint(os.path.join(dump, "metrics_step2.pt"))
    torch.testing.assert_close(features["fid64/generated"], feature_network.embed(net, torch.cat(images)),
                               rtol=0, atol=1e-4)
