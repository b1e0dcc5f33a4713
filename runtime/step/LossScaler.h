// Dynamic loss scaling, torch.amp.GradScaler's arithmetic, with its state on the device.
#pragma once

#include "ir/Module.h"
#include "runtime/rundir/Dict.h"

#include <torch/torch.h>

#include <vector>

namespace ganc::runtime {

/// One dynamic loss scaler, shared by the phases that name it. Every step of a phase that
/// uses it: the executor multiplies the loss by scale(); after the all-reduce, unscale()
/// multiplies each optimizer's gradients by 1/scale and flags inf/NaN (the optimizer step is
/// skipped where flagged); update() then grows or backs off the scale. The scale, growth
/// tracker and flags are device tensors: nothing is read on the host (a CUDA Graph holds it).
class LossScaler {
public:
  LossScaler(const ir::LossScaler &spec, c10::Device device);

  /// The current scale (a 0-dim float32 device tensor, updated in place).
  const at::Tensor &scale() const { return scale_; }
  /// GradScaler.unscale_(optimizer): `grads` (those defined) times 1/scale, in place.
  /// Returns this optimizer's found-inf flag (1.0 if any was inf/NaN).
  at::Tensor unscale(const std::vector<at::Tensor> &grads);
  /// GradScaler.update(): the flags of the optimizers unscaled since the last update, summed,
  /// decide growth or backoff.
  void update(const std::vector<at::Tensor> &foundInf);

  /// {"scale", "growth_tracker"} for checkpoints, and back.
  c10::impl::GenericDict stateDict() const;
  void loadStateDict(const c10::impl::GenericDict &state);

private:
  ir::LossScaler spec_;
  at::Tensor scale_;
  at::Tensor growthTracker_;
};

/// 1.0 (a 0-dim float32 tensor on `device`) if any defined tensor of `grads` holds an inf or
/// NaN, else 0.0; computed on the device, nothing read on the host.
at::Tensor nonFiniteFlag(const std::vector<at::Tensor> &grads, c10::Device device);

} // namespace ganc::runtime
