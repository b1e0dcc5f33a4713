// Controllers of the training step: StyleGAN2-ADA's adaptive augmentation probability.
#include "runtime/step/Controller.h"

#include "runtime/rundir/Dict.h"
#include "support/torch/Collectives.h"

#include <algorithm>

namespace ganc::runtime {

Controller::Controller(const frontend::ControllerSpec &spec, c10::Device device,
                       c10::ScalarType dtype)
    : spec_(spec) {
  value_ = torch::full({}, spec.initial, at::TensorOptions(device).dtype(dtype));
  step_ = torch::zeros({2}, at::TensorOptions(device).dtype(at::kDouble));
  totals_ = torch::zeros({2}, at::TensorOptions(device).dtype(at::kDouble));
}

void Controller::observe(const std::string &phase,
                         const std::vector<std::pair<std::string, at::Tensor>> &stats) {
  if (std::find(spec_.phases.begin(), spec_.phases.end(), phase) == spec_.phases.end())
    return;
  torch::NoGradGuard noGrad;
  for (const auto &[name, value] : stats)
    if (name == spec_.statistic) {
      step_[0].add_(value.to(at::kDouble).reshape({}));
      step_[1].add_(1.0);
    }
}

void Controller::endStep(int64_t done, int64_t images, c10d::Backend &group) {
  torch::NoGradGuard noGrad;
  std::vector<at::Tensor> io{step_};
  c10d::AllreduceOptions sum;
  waitFor(group.allreduce(io, sum));
  totals_.add_(step_);
  step_.zero_();
  intervalImages_ += images;
  if (done % spec_.interval != 0)
    return;
  const at::Tensor totals = totals_.cpu();
  const double count = totals[1].item<double>();
  if (count > 0) {
    // StyleGAN2-ADA: adjust = sign(mean - target) * (batch * interval) / (ada_kimg * 1000);
    // p = max(p + adjust, 0), in p's dtype.
    const double mean = totals[0].item<double>() / count;
    const double sign = mean > spec_.target ? 1.0 : mean < spec_.target ? -1.0 : 0.0;
    value_.add_(sign * static_cast<double>(intervalImages_) / (spec_.speedKimg * 1000.0))
        .clamp_min_(0.0);
  }
  totals_.zero_();
  intervalImages_ = 0;
}

c10::impl::GenericDict Controller::stateDict() const {
  c10::impl::GenericDict state = makeDict();
  state.insert("value", value_.cpu());
  state.insert("totals", totals_.cpu());
  state.insert("interval_images", intervalImages_);
  return state;
}

void Controller::loadStateDict(const c10::impl::GenericDict &state) {
  torch::NoGradGuard noGrad;
  value_.copy_(state.at("value").toTensor());
  totals_.copy_(state.at("totals").toTensor());
  intervalImages_ = state.at("interval_images").toInt();
}

} // namespace ganc::runtime
