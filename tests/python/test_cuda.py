"""GPU tests of the CUDA backend (NCCL, whole-phase CUDA Graph capture and replay).

They need a CUDA GPU and are reported as skipped, with the reason, on machines without one
(CI has none). On a GPU machine: N replayed iterations equal N eager iterations of the same
plan; ganc on NCCL matches eager PyTorch DDP on NCCL at world size 1; a phase with a host
sync falls back to eager replay and says so.
"""
import os
import subprocess

import pytest
import torch

import ganc
from ganc import oracle
from conftest import archive

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU on this machine; the CUDA Graph tests need one")

STEPS = 10


def train_cuda(ganc_bin, model, data, out, *extra):
    plan = os.path.join(out, model + ".plan")
    subprocess.run([ganc_bin, "compile", archive(model), "-o", plan], check=True)
    dump = os.path.join(out, "dump")
    r = subprocess.run([ganc_bin, "run", "--nproc", "1", plan, "--model", archive(model), "--data", data,
                        "--device", "cuda", "--steps", str(STEPS), "--seed", "7",
                        "--out", os.path.join(out, "train"), "--sample-every", "0",
                        "--checkpoint-every", "0", "--log-every", str(STEPS), "--dump-grads", dump, *extra],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return dump, r.stderr


def compare(got_dir, ref_dir, spec, grad_tol, param_tol, ref_loader=torch.load):
    for step in range(STEPS):
        for phase in spec["phases"]:
            name = f"grads_step{step}_{phase['name']}.pt"
            got = ganc.load_checkpoint(os.path.join(got_dir, name))
            ref = ref_loader(os.path.join(ref_dir, name))
            assert set(got) == set(ref), name
            for p in ref:
                err = ((got[p] - ref[p]).abs().max() / ref[p].abs().max().clamp_min(1e-30)).item()
                assert err <= grad_tol, f"{name}: {p} differs by {err:.2e}"
    got = ganc.load_checkpoint(os.path.join(got_dir, "params_final.pt"))
    ref = ref_loader(os.path.join(ref_dir, "params_final.pt"))
    for p in ref:
        err = ((got[p].double() - ref[p].double()).abs().max() / ref[p].double().abs().max().clamp_min(1e-30)).item()
        assert err <= param_tol, f"after {STEPS} steps {p} differs by {err:.2e}"


def test_replayed_iterations_equal_eager_iterations(ganc_bin, datasets, tmp_path):
    spec = ganc.load_spec(archive("dcgan32"))
    replay, _ = train_cuda(ganc_bin, "dcgan32", datasets["digits"], str(tmp_path / "graph"),
                           "--cuda-graphs", "on", "--warmup", "2")
    eager, _ = train_cuda(ganc_bin, "dcgan32", datasets["digits"], str(tmp_path / "eager"),
                          "--cuda-graphs", "off")
    compare(replay, eager, spec, grad_tol=1e-6, param_tol=1e-6, ref_loader=ganc.load_checkpoint)


def test_parity_with_eager_ddp_on_nccl(ganc_bin, datasets, tmp_path):
    spec = ganc.load_spec(archive("dcgan32"))
    got, _ = train_cuda(ganc_bin, "dcgan32", datasets["digits"], str(tmp_path / "ganc"))
    ref = str(tmp_path / "ddp")
    oracle.run(archive("dcgan32"), datasets["digits"], 1, STEPS, 7, out_dir=ref, device="cuda")
    compare(got, ref, spec, grad_tol=1e-5, param_tol=1e-4)


def test_host_sync_phase_falls_back_to_eager(ganc_bin, datasets, tmp_path):
    _, err = train_cuda(ganc_bin, "probe_sync", datasets["ring"], str(tmp_path))
    assert "phase 'g' runs eagerly: aten::Bool" in err
    assert "phase 'd' runs eagerly" not in err
