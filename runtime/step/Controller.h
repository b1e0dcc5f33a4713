// Controllers of the training step: StyleGAN2-ADA's adaptive augmentation probability.
#pragma once

#include "frontend/Spec.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace ganc::runtime {

/// One controller: a 0-dim value the phases read as an input (updated in place, so a captured
/// phase reads it at its fixed address), adjusted from the mean of its phases' logged statistic
/// over every rank by StyleGAN2-ADA's rule (frontend::ControllerSpec). Every rank holds the
/// same value and totals.
class Controller {
public:
  Controller(const frontend::ControllerSpec &spec, c10::Device device, c10::ScalarType dtype);
  const frontend::ControllerSpec &spec() const { return spec_; }
  /// The value phases read (p).
  const at::Tensor &value() const { return value_; }
  /// After a run of phase `phase`, its logged values (each the mean over its micro-batches, on
  /// the device): this rank's statistic joins the step's sum.
  void observe(const std::string &phase,
               const std::vector<std::pair<std::string, at::Tensor>> &stats);
  /// After step `done` on every rank: the step's sums are all-reduced into the totals; every
  /// `interval` steps the value is adjusted from them (`images`: the interval's images over
  /// every rank) and they start again.
  void endStep(int64_t done, int64_t images, c10d::Backend &group);
  /// {"value", "totals"} for checkpoints, and back.
  c10::impl::GenericDict stateDict() const;
  void loadStateDict(const c10::impl::GenericDict &state);

private:
  frontend::ControllerSpec spec_;
  at::Tensor value_;
  /// [sum, count] of the statistic: this step's on this rank, and every rank's since the last
  /// adjustment (float64, on the device).
  at::Tensor step_, totals_;
  int64_t intervalImages_ = 0;
};

} // namespace ganc::runtime
