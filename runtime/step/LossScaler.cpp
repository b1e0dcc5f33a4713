// Dynamic loss scaling (torch/amp/grad_scaler.py) in C++.
#include "runtime/step/LossScaler.h"

namespace ganc::runtime {

LossScaler::LossScaler(const ir::LossScaler &spec, c10::Device device) : spec_(spec) {
  scale_ = torch::full({}, spec.initScale, at::TensorOptions(device).dtype(torch::kFloat32));
  growthTracker_ = torch::zeros({}, at::TensorOptions(device).dtype(torch::kInt32));
}

at::Tensor LossScaler::unscale(const std::vector<at::Tensor> &gradients) {
  torch::NoGradGuard noGrad;
  // GradScaler: the reciprocal in double, then float32.
  at::Tensor inverse = scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32);
  at::Tensor foundInf = torch::zeros({}, scale_.options());
  std::vector<at::Tensor> grads;
  for (const at::Tensor &g : gradients)
    if (g.defined() && g.numel() > 0)
      grads.push_back(g);
  if (!grads.empty())
    at::_amp_foreach_non_finite_check_and_unscale_(grads, foundInf, inverse);
  return foundInf;
}

void LossScaler::update(const std::vector<at::Tensor> &foundInf) {
  if (foundInf.empty())
    return;
  torch::NoGradGuard noGrad;
  at::Tensor combined = foundInf[0];
  for (size_t i = 1; i < foundInf.size(); ++i)
    combined = combined + foundInf[i];
  at::_amp_update_scale_(scale_, growthTracker_, combined, spec_.growthFactor, spec_.backoffFactor,
                         spec_.growthInterval);
}

at::Tensor nonFiniteFlag(const std::vector<at::Tensor> &gradients, c10::Device device) {
  torch::NoGradGuard noGrad;
  auto options = at::TensorOptions(device).dtype(torch::kFloat32);
  at::Tensor found = torch::zeros({}, options);
  std::vector<at::Tensor> grads;
  for (const at::Tensor &g : gradients)
    if (g.defined() && g.numel() > 0)
      grads.push_back(g);
  // GradScaler's check with a scale of 1: the multiply leaves every value as it was.
  if (!grads.empty())
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found, torch::ones({}, options));
  return found;
}

c10::impl::GenericDict LossScaler::stateDict() const {
  c10::impl::GenericDict out = makeDict();
  out.insert("scale", scale_.cpu());
  out.insert("growth_tracker", growthTracker_.cpu());
  return out;
}

void LossScaler::loadStateDict(const c10::impl::GenericDict &state) {
  torch::NoGradGuard noGrad;
  scale_.copy_(state.at("scale").toTensor());
  growthTracker_.copy_(state.at("growth_tracker").toTensor());
}

} // namespace ganc::runtime
