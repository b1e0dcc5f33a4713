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
  explicit Optimizer(frontend::OptimizerSpec spec) : spec_(std::move(spec)) {}

  /// One step over `parameters` (their .grad holds the all-reduced gradient), exactly as
  /// torch.optim's single-tensor implementation of the same optimizer does it.
  void step(const std::vector<std::string> &names, const std::vector<at::Tensor> &parameters);

  /// State as {"state": {name: {...}}, "hyper": {...}}, loadable by torch.load.
  c10::impl::GenericDict stateDict() const;
  void loadStateDict(const c10::impl::GenericDict &state);
  const frontend::OptimizerSpec &spec() const { return spec_; }

private:
  struct ParamState {
    double step = 0; // torch.optim keeps this as a float tensor; it only counts steps
    at::Tensor expAvg, expAvgSq, momentum;
  };
  void adam(const at::Tensor &param, ParamState &state);
  void sgd(const at::Tensor &param, ParamState &state);

  frontend::OptimizerSpec spec_;
  std::map<std::string, ParamState> state_;
};

} // namespace ganc::runtime
