// Adam and AdamW (with AMSGrad), SGD (momentum, dampening, Nesterov) and RMSprop (momentum,
// centred): torch.optim's math and state, one optimizer per
// optimizer group, stepping only over the parameters a phase used; learning-rate schedules.
#pragma once

#include "frontend/Spec.h"
#include "runtime/rundir/Dict.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ganc::runtime {

/// A torch.optim.lr_scheduler's learning rates, computed with its own recursive (chainable)
/// arithmetic in double precision, so every value equals the Python float torch sets.
class LrSchedule {
public:
  LrSchedule(frontend::LrScheduleSpec spec, double baseLr);
  /// The learning rate after `step` calls of scheduler.step() (step 0: after construction).
  double at(int64_t step);

private:
  /// The next value: get_lr() with last_epoch = epoch_ + 1.
  double next() const;
  frontend::LrScheduleSpec spec_;
  double baseLr_;
  double lr_;
  int64_t epoch_ = 0;
};

/// One optimizer group's optimizer. Per-parameter state is keyed by the parameter's name.
class Optimizer {
public:
  Optimizer(frontend::OptimizerSpec spec, c10::Device device);

  /// Sets the learning rate for training step `step` (its schedule's value; constant without
  /// one). On CUDA a scheduled learning rate lives in a device tensor the fused kernels read,
  /// updated by a kernel launched before the step's phases: no host synchronisation, and a
  /// captured graph reads the new value.
  void beginStep(int64_t step);
  /// The learning rate of the current step.
  double lr() const { return lr_; }

  /// One step over `parameters` with the all-reduced gradients `grads` (an undefined one: no
  /// gradient, no step), exactly as torch.optim does it: its single-tensor code on CPU; on CUDA its
  /// fused kernels (fused=True), whose step counts live on the device so a captured graph stays
  /// valid. `foundInf`, when given, is a loss scaler's flag for these gradients: where it is set
  /// the step is skipped (state and step counts unchanged), as GradScaler.step does — on CPU
  /// by reading it (no device to synchronise with), on CUDA inside the fused kernels.
  /// Sharded, `parameters` and `grads` are this rank's pieces (1-D views) and the state is
  /// kept for the pieces only; the arithmetic is elementwise, so it is the same.
  void step(const std::vector<std::string> &names, const std::vector<at::Tensor> &parameters,
            const std::vector<at::Tensor> &grads, const at::Tensor &foundInf = at::Tensor());
  /// Bytes of optimizer state this rank holds (moments, momentum buffers, step counts).
  int64_t stateBytes() const;

  /// State as {"state": {name: {...}}, "hyper": {...}}, loadable by torch.load.
  /// Sharded, the tensors are this rank's pieces (see gatherState for the whole).
  c10::impl::GenericDict stateDict() const;
  void loadStateDict(const c10::impl::GenericDict &state);
  /// Sharded: keeps only this rank's piece of each loaded (whole) state tensor; `parameters`
  /// gives each one's shape and memory order.
  void keepPieces(const std::map<std::string, at::Tensor> &parameters, int64_t ranks, int64_t rank);
  const frontend::OptimizerSpec &spec() const { return spec_; }

private:
  struct ParamState {
    double step = 0;       // CPU: torch.optim keeps this as a float tensor; it only counts
    at::Tensor deviceStep; // CUDA: the same count, on the device
    // expAvgSq is RMSprop's square_avg; maxExpAvgSq AMSGrad's; gradAvg centred RMSprop's.
    at::Tensor expAvg, expAvgSq, maxExpAvgSq, momentum, gradAvg;
  };
  void adam(const at::Tensor &param, at::Tensor grad, ParamState &state);
  void sgd(const at::Tensor &param, at::Tensor grad, ParamState &state);
  void rmsprop(const at::Tensor &param, at::Tensor grad, ParamState &state, const c10::Scalar &lr);
  /// RMSprop on CUDA (no fused kernel): the single-tensor arithmetic, capturable.
  void rmspropStep(const std::vector<std::string> &names, const std::vector<at::Tensor> &params,
                   const std::vector<at::Tensor> &grads, const at::Tensor &foundInf);
  /// The weight clamp ("clamp_weights") over the parameters a step stepped.
  void clampStepped(const std::vector<at::Tensor> &parameters,
                    const std::vector<at::Tensor> &grads);
  void fusedStep(const std::vector<std::string> &names, const std::vector<at::Tensor> &params,
                 const std::vector<at::Tensor> &grads, const at::Tensor &foundInf);

  frontend::OptimizerSpec spec_;
  c10::Device device_;
  std::map<std::string, ParamState> state_;
  std::optional<LrSchedule> schedule_;
  double lr_;
  /// CUDA with a schedule: the learning rate as a float32 device tensor.
  at::Tensor lrTensor_;
};

/// torch.nn.utils.clip_grad_norm_ over `grads` (undefined ones skipped) with its default
/// foreach arithmetic: the total norm of the per-tensor norms, then every gradient times
/// min(1, maxNorm / (total + 1e-6)). Device tensors only: no host synchronisation.
void clipGradNorm(const std::vector<at::Tensor> &grads, double maxNorm, double normType);
/// The same clipping when `grads` are one rank's pieces of the gradients: this rank's part
/// of the norm (the sum of |norm|^p of its pieces, or their max for the infinity norm), to
/// be combined across ranks (sum, or max) before scaleByNorm.
at::Tensor localNormPart(const std::vector<at::Tensor> &grads, double normType);
/// Multiplies `grads` by min(1, maxNorm / (total + 1e-6)), `combined` being every rank's
/// localNormPart combined.
void scaleByNorm(const std::vector<at::Tensor> &grads, const at::Tensor &combined, double maxNorm,
                 double normType);

} // namespace ganc::runtime
