// Adam, AdamW and SGD with momentum: torch.optim's math and state, one optimizer per
// submodule, stepping only over the parameters a phase used.
#pragma once

#include "frontend/Spec.h"
#include "runtime/Dict.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ganc::runtime {

/// One submodule's optimizer. Per-parameter state is keyed by the parameter's name.
class Optimizer {
public:
  Optimizer(frontend::OptimizerSpec spec, c10::Device device)
      : spec_(std::move(spec)), device_(device) {}

  /// One step over `parameters` (their .grad holds the all-reduced gradient), exactly as
  /// torch.optim does it: its single-tensor code on CPU; on CUDA its fused kernels
  /// (fused=True), whose step counts live on the device so a captured graph stays valid.
  /// `foundInf`, when given, is a loss scaler's flag for these gradients: where it is set
  /// the step is skipped (state and step counts unchanged), as GradScaler.step does — on CPU
  /// by reading it (no device to synchronise with), on CUDA inside the fused kernels.
  void step(const std::vector<std::string> &names, const std::vector<at::Tensor> &parameters,
            const at::Tensor &foundInf = at::Tensor());

  /// State as {"state": {name: {...}}, "hyper": {...}}, loadable by torch.load.
  c10::impl::GenericDict stateDict() const;
  void loadStateDict(const c10::impl::GenericDict &state);
  const frontend::OptimizerSpec &spec() const { return spec_; }

private:
  struct ParamState {
    double step = 0;       // CPU: torch.optim keeps this as a float tensor; it only counts
    at::Tensor deviceStep; // CUDA: the same count, on the device
    at::Tensor expAvg, expAvgSq, momentum;
  };
  void adam(const at::Tensor &param, ParamState &state);
  void sgd(const at::Tensor &param, ParamState &state);
  void fusedStep(const std::vector<std::string> &names, const std::vector<at::Tensor> &params,
                 const at::Tensor &foundInf);

  frontend::OptimizerSpec spec_;
  c10::Device device_;
  std::map<std::string, ParamState> state_;
};

/// torch.nn.utils.clip_grad_norm_(parameters, maxNorm, normType) with its default foreach
/// arithmetic: the total norm of the per-tensor norms, then every .grad times
/// min(1, maxNorm / (total + 1e-6)). Device tensors only: no host synchronisation.
void clipGradNorm(const std::vector<at::Tensor> &parameters, double maxNorm, double normType);

} // namespace ganc::runtime
