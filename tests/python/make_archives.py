"""Writes the archives the tests use into OUTDIR: every zoo model and test probe (scripted, and
the MLP GAN traced too) and a set of broken inputs for the bad-input tests."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "models"))

import torch  # noqa: E402
import ganc  # noqa: E402
from ganc.spec import dumps  # noqa: E402
import zoo  # noqa: E402
import probes  # noqa: E402

probes.register()  # test-only probe GANs, exported with the zoo


class NotScalar(zoo.MLPGAN):
    def phase_g(self, z):
        return -self.discriminator(self.generator(z))  # per-sample losses, not a scalar


class WrongShapes(zoo.MLPGAN):
    def phase_g(self, z):
        w = torch.zeros(3, 5)
        return (self.discriminator(self.generator(z)) @ w).mean()  # fails in the interpreter


def save_raw(module, spec, path):
    """Saves without the helper's validation, as a careless exporter would."""
    methods = [p["method"] for p in spec["phases"] if hasattr(module, p["method"])]
    with ganc.phase_methods_scripted(module, methods):
        scripted = torch.jit.script(module)
    torch.jit.save(scripted, path, _extra_files={"ganc.json": dumps(spec)})


# The CPU tests' slowest archives train at batch 8: CPUs emulate bfloat16 and float16
# convolutions (no native kernels on AVX2), and float64 ones run at half float32's speed. What
# these archives test (autocast, loss scaling, accumulation, clipping, synchronised batch norm)
# does not depend on the batch.
SMALL_BATCH = 8
SMALL_BATCH_ZOO = {"dcgan32_amp", "dcgan32_all"}


def main(out):
    os.makedirs(out, exist_ok=True)
    for name in zoo.ZOO:
        gan, spec = zoo.build(name)
        if name in SMALL_BATCH_ZOO:
            spec = dict(spec, batch_size=SMALL_BATCH)
        ganc.export(gan, os.path.join(out, name + ".pt"), spec)
    gan, spec = zoo.build("mlp")
    ganc.export(gan, os.path.join(out, "mlp_traced.pt"), spec, trace=True)
    # DDP's default buffer policy: rank 0's BatchNorm statistics broadcast before each phase.
    gan, spec = zoo.build("dcgan32")
    ganc.export(gan, os.path.join(out, "dcgan32_broadcast.pt"), dict(spec, buffers="broadcast"))
    # float64: the StyleGAN2-ADA-style model against eager DDP running its own autograd
    # Functions' backward (other kernels than the derived gradient's: see test_intake.py).
    gan, spec = zoo.build("stylegan2_ada")
    ganc.export(gan.double(), os.path.join(out, "stylegan2_ada_f64.pt"), dict(spec, dtype="float64"),
                verbose=False)
    # float64: the StyleGAN3-style model fused, against eager DDP on the reference compositions.
    gan, spec = zoo.build("stylegan3")
    ganc.export(gan.double(), os.path.join(out, "stylegan3_f64.pt"), dict(spec, dtype="float64"), verbose=False)
    # float64: the parity comparison at 3 ranks, where float32 sums in a different order
    # than DDP's buckets and Adam amplifies the last-bit differences.
    gan, spec = zoo.build("dcgan32")
    ganc.export(gan.double(), os.path.join(out, "dcgan32_f64.pt"),
                dict(spec, dtype="float64", batch_size=SMALL_BATCH))
    # StyleGAN2 at 3 ranks, sharded against unsharded and eager ZeroRedundancyOptimizer: the
    # sharded buckets put three float32 addends in another order (as above).
    gan, spec = zoo.build("stylegan2")
    ganc.export(gan.double(), os.path.join(out, "stylegan2_f64.pt"),
                dict(spec, dtype="float64", batch_size=SMALL_BATCH))
    # Synchronised batch norm against one process on the concatenated batch: the statistics
    # are summed in another order, a last-bit difference Adam's first steps amplify in float32.
    gan, spec = zoo.build("dcgan32_syncbn")
    ganc.export(gan.double(), os.path.join(out, "dcgan32_syncbn_f64.pt"), dict(spec, dtype="float64"))
    # All five training-step features, likewise against the concatenated batch; autocast
    # leaves float64 alone (on both sides), and dcgan32_amp tests it bit for bit against DDP.
    gan, spec = zoo.build("dcgan32_all")
    ganc.export(gan.double(), os.path.join(out, "dcgan32_all_f64.pt"),
                dict(spec, dtype="float64", batch_size=SMALL_BATCH))
    # BigGAN's conditional batch norms (affine=False layers) synchronised, likewise.
    gan, spec = zoo.build("biggan32")
    ganc.export(gan.double(), os.path.join(out, "biggan32_f64.pt"),
                dict(spec, dtype="float64", batch_size=SMALL_BATCH))
    # One training-step feature at a time (dcgan32_amp has them all): accumulation alone,
    # clipping alone (G by its 2-norm, D by its max norm, both low enough to clip), autocast
    # alone.
    gan, _ = zoo.build("dcgan32")
    one = lambda loss_scaling=False, batch=32, **kw: zoo.training_step_spec(
        "dcgan32", batch, [3, 32, 32], [100, 1, 1], loss_scaling=loss_scaling, **kw)
    ganc.export(gan, os.path.join(out, "dcgan32_accumulate.pt"),
                one(precision="float32", accumulate_d=3, clip_g=None))
    spec = one(precision="float32", accumulate_d=1, clip_g=0.05)
    spec["optimizers"]["discriminator"]["clip_grad_norm"] = {"max_norm": 0.01, "norm_type": "inf"}
    ganc.export(gan, os.path.join(out, "dcgan32_clip.pt"), spec)
    # Sharded, a 2-norm is summed from each rank's pieces, in another order than over whole
    # gradients: a last-bit difference that clipping this far below the gradients' norm turns
    # into Adam's epsilon regime, so the sharded comparison of clipping runs in float64.
    ganc.export(zoo.build("dcgan32")[0].double(), os.path.join(out, "dcgan32_clip_f64.pt"),
                dict(spec, dtype="float64"))
    ganc.export(gan, os.path.join(out, "dcgan32_bf16.pt"),
                one(precision="bfloat16", accumulate_d=1, clip_g=None, batch=SMALL_BATCH))
    # float16 autocast with dynamic loss scaling, one scaler shared by both phases, starting so
    # high (2^24) that the first steps overflow in float16, are skipped and back off; growth
    # every 3 clean steps. Batch 4: float16 convolutions are the dearest emulated ones (30 s of
    # the parity suite at batch 8), and overflowing at 2^24 does not depend on the batch.
    spec = one(precision="float16", accumulate_d=1, clip_g=None, loss_scaling=True, batch=SMALL_BATCH // 2)
    spec["loss_scalers"] = {"amp": {"init_scale": 2.0 ** 24, "growth_interval": 3}}
    ganc.export(gan, os.path.join(out, "dcgan32_scaled.pt"), spec)

    # non_finite: skip: a step whose gradients hold an inf or NaN is skipped and counted.
    gan, spec = zoo.build("mlp")
    ganc.export(gan, os.path.join(out, "mlp_skip.pt"), dict(spec, ganc_spec=2, non_finite="skip"))

    # Learning-rate schedules, all five types over two archives of the three-group MLP GAN
    # (discriminator, generator, logit_scale): cosine annealing past t_max (its restart
    # branch), linear warm-up, step decay; exponential decay and a constant factor.
    gan, spec = zoo.build("mlp_temperature")
    spec["optimizers"]["discriminator"]["lr_schedule"] = {"type": "cosine", "t_max": 4, "eta_min": 1e-4}
    spec["optimizers"]["generator"]["lr_schedule"] = {"type": "linear", "start_factor": 0.1, "total_iters": 4}
    spec["optimizers"]["logit_scale"]["lr_schedule"] = {"type": "step", "step_size": 3, "gamma": 0.5}
    ganc.export(gan, os.path.join(out, "mlp_schedules.pt"), spec)
    gan, spec = zoo.build("mlp_temperature")
    spec["optimizers"]["discriminator"]["lr_schedule"] = {"type": "exponential", "gamma": 0.8}
    spec["optimizers"]["generator"]["lr_schedule"] = {"type": "constant", "factor": 0.5, "total_iters": 3}
    ganc.export(gan, os.path.join(out, "mlp_schedules_decay.pt"), spec)

    with open(os.path.join(out, "bad_not_archive.pt"), "w") as f:
        f.write("this is not a TorchScript archive\n")
    gan, spec = zoo.build("mlp")
    with ganc.phase_methods_scripted(gan, [p["method"] for p in spec["phases"]]):
        torch.jit.save(torch.jit.script(gan), os.path.join(out, "bad_no_spec.pt"))
    bad = dict(spec, phases=[dict(spec["phases"][0], method="phase_missing"), spec["phases"][1]])
    save_raw(zoo.MLPGAN(), bad, os.path.join(out, "bad_missing_method.pt"))
    bad = dict(spec, phases=[spec["phases"][0], dict(spec["phases"][1], updates=["mapping"])],
               optimizers={"discriminator": spec["optimizers"]["discriminator"]})
    save_raw(zoo.MLPGAN(), bad, os.path.join(out, "bad_missing_submodule.pt"))
    bad = dict(spec, phases=[spec["phases"][0], dict(spec["phases"][1], interval=0)])
    save_raw(zoo.MLPGAN(), bad, os.path.join(out, "bad_zero_interval.pt"))
    sync_gan, sync_spec = zoo.build("dcgan32_syncbn")  # DCGAN's discriminator has no batch norm
    save_raw(sync_gan, dict(sync_spec, sync_batch_norm=["discriminator"]),
             os.path.join(out, "bad_sync_no_bn.pt"))
    # `updates` and optimizer groups resolved against the module: a path that names nothing,
    # a parameter in two groups.
    bad = dict(spec, ganc_spec=2, phases=[dict(spec["phases"][0], updates=["discriminator.net.9"]),
                                          spec["phases"][1]],
               optimizers={"generator": spec["optimizers"]["generator"]})
    save_raw(zoo.MLPGAN(), bad, os.path.join(out, "bad_update_path.pt"))
    bad = dict(spec, ganc_spec=2, optimizers=dict(spec["optimizers"], head={
        "type": "adam", "params": ["discriminator.net.4"]}))
    save_raw(zoo.MLPGAN(), bad, os.path.join(out, "bad_two_groups.pt"))
    save_raw(NotScalar(), spec, os.path.join(out, "bad_not_scalar.pt"))
    save_raw(WrongShapes(), spec, os.path.join(out, "bad_interpreter.pt"))
    gan, spec = zoo.build("mlp_ema")
    save_raw(gan, dict(spec, ema=dict(spec["ema"], copy="generator_average")),
             os.path.join(out, "bad_ema_copy.pt"))
    # Progressive growing: a stage growing a block that does not exist, one growing a block an
    # earlier stage already trains, a stage attribute that does not exist.
    gan, spec = zoo.build("pggan_quick")

    def stages(list_=None, attributes=None):
        s = dict(spec["stages"])
        if list_ is not None:
            s["list"] = list_
        if attributes is not None:
            s["attributes"] = attributes
        return dict(spec, stages=s)

    grown = spec["stages"]["list"]
    save_raw(gan, stages([grown[0], dict(grown[1], grows=["generator.blocks.7"]), grown[2]]),
             os.path.join(out, "bad_stage_block.pt"))
    save_raw(gan, stages([grown[0], grown[1], dict(grown[2], grows=["generator.to_rgb.1"])]),
             os.path.join(out, "bad_stage_regrow.pt"))
    save_raw(gan, stages(attributes=["generator.stage", "discriminator.level"]),
             os.path.join(out, "bad_stage_attribute.pt"))
    print(f"wrote test archives to {out}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("outdir", help="folder the archives are written into (made if missing)")
    main(parser.parse_args().outdir)
