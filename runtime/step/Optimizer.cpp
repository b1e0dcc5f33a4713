// torch.optim's Adam / AdamW / SGD / RMSprop (single-tensor code paths, as used on CPU) in C++.
#include "runtime/step/Optimizer.h"

#include "backend/Reducer.h"

#include <cmath>

namespace ganc::runtime {

LrSchedule::LrSchedule(frontend::LrScheduleSpec spec, double baseLr)
    : spec_(std::move(spec)), baseLr_(baseLr) {
  // The constructor's initial step: get_lr() at last_epoch 0.
  lr_ = spec_.type == "constant" ? baseLr * spec_.factor
        : spec_.type == "linear" ? baseLr * spec_.startFactor
                                 : baseLr;
}

double LrSchedule::next() const {
  // torch/optim/lr_scheduler.py, each class's get_lr(), operation for operation.
  const frontend::LrScheduleSpec &s = spec_;
  const int64_t e = epoch_ + 1;
  if (s.type == "constant")
    return e != s.totalIters ? lr_ : lr_ * (1.0 / s.factor);
  if (s.type == "linear") {
    if (e > s.totalIters)
      return lr_;
    return lr_ * (1.0 + (s.endFactor - s.startFactor) /
                            (static_cast<double>(s.totalIters) * s.startFactor +
                             static_cast<double>(e - 1) * (s.endFactor - s.startFactor)));
  }
  if (s.type == "step")
    return e % s.stepSize != 0 ? lr_ : lr_ * s.gamma;
  if (s.type == "exponential")
    return lr_ * s.gamma;
  // cosine
  const double tMax = static_cast<double>(s.tMax);
  if ((e - 1 - s.tMax) % (2 * s.tMax) == 0)
    return lr_ + (baseLr_ - s.etaMin) * (1 - std::cos(M_PI / tMax)) / 2;
  return (1 + std::cos(M_PI * static_cast<double>(e) / tMax)) /
             (1 + std::cos(M_PI * static_cast<double>(e - 1) / tMax)) * (lr_ - s.etaMin) +
         s.etaMin;
}

double LrSchedule::at(int64_t step) {
  if (step < epoch_)
    *this = LrSchedule(spec_, baseLr_);
  while (epoch_ < step) {
    lr_ = next();
    ++epoch_;
  }
  return lr_;
}

Optimizer::Optimizer(frontend::OptimizerSpec spec, c10::Device device)
    : spec_(std::move(spec)), device_(device), lr_(spec_.lr) {
  if (spec_.schedule) {
    schedule_.emplace(*spec_.schedule, spec_.lr);
    lr_ = schedule_->at(0);
    if (device_.is_cuda())
      lrTensor_ = torch::full({}, lr_, at::TensorOptions(device_).dtype(torch::kFloat32));
  }
}

void Optimizer::beginStep(int64_t step) {
  if (!schedule_)
    return;
  lr_ = schedule_->at(step);
  if (lrTensor_.defined())
    lrTensor_.fill_(lr_);
}

void Optimizer::step(const std::vector<std::string> &names,
                     const std::vector<at::Tensor> &parameters,
                     const std::vector<at::Tensor> &grads, const at::Tensor &foundInf) {
  torch::NoGradGuard noGrad;
  if (!parameters.empty() && parameters.front().is_cuda()) {
    if (spec_.type == "rmsprop")
      rmspropStep(names, parameters, grads, foundInf);
    else
      fusedStep(names, parameters, grads, foundInf);
    clampStepped(parameters, grads);
    return;
  }
  // GradScaler skips the step where the scaled gradients hold inf/NaN; the clamp after it
  // still runs, as the code that calls optimizer.step() runs it.
  if (!foundInf.defined() || foundInf.item<float>() == 0) {
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (!grads[i].defined())
        continue;
      ParamState &state = state_[names[i]];
      if (spec_.type == "sgd")
        sgd(parameters[i], grads[i], state);
      else if (spec_.type == "rmsprop")
        rmsprop(parameters[i], grads[i], state, lr_);
      else
        adam(parameters[i], grads[i], state);
    }
  }
  clampStepped(parameters, grads);
}

void Optimizer::clampStepped(const std::vector<at::Tensor> &parameters,
                             const std::vector<at::Tensor> &grads) {
  if (!spec_.clampWeights)
    return;
  // `p.data.clamp_(-c, c)` after optimizer.step(), for the parameters it stepped.
  std::vector<at::Tensor> stepped;
  for (size_t i = 0; i < parameters.size(); ++i)
    if (grads[i].defined())
      stepped.push_back(parameters[i]);
  if (stepped.empty())
    return;
  at::_foreach_clamp_min_(stepped, -*spec_.clampWeights);
  at::_foreach_clamp_max_(stepped, *spec_.clampWeights);
}

int64_t Optimizer::stateBytes() const {
  int64_t bytes = 0;
  for (const auto &[name, s] : state_)
    for (const at::Tensor *t :
         {&s.deviceStep, &s.expAvg, &s.expAvgSq, &s.maxExpAvgSq, &s.momentum, &s.gradAvg})
      if (t->defined())
        bytes += static_cast<int64_t>(t->nbytes());
  return bytes + static_cast<int64_t>(state_.size() * sizeof(float)) * !device_.is_cuda();
}

void Optimizer::adam(const at::Tensor &param, at::Tensor grad, ParamState &state) {
  // torch/optim/adam.py::_single_tensor_adam (maximize=False).
  at::Tensor p = param;
  if (!state.expAvg.defined()) {
    state.expAvg = torch::zeros_like(p, at::MemoryFormat::Preserve);
    state.expAvgSq = torch::zeros_like(p, at::MemoryFormat::Preserve);
    if (spec_.amsgrad)
      state.maxExpAvgSq = torch::zeros_like(p, at::MemoryFormat::Preserve);
  }
  state.step += 1;
  if (spec_.weightDecay != 0) {
    if (spec_.type == "adamw")
      p.mul_(1 - lr_ * spec_.weightDecay);
    else
      grad = grad.add(p, spec_.weightDecay);
  }
  state.expAvg.lerp_(grad, 1 - spec_.beta1);
  state.expAvgSq.mul_(spec_.beta2).addcmul_(grad, grad, 1 - spec_.beta2);
  double biasCorrection1 = 1 - std::pow(spec_.beta1, state.step);
  double biasCorrection2 = 1 - std::pow(spec_.beta2, state.step);
  double stepSize = lr_ / biasCorrection1;
  double biasCorrection2Sqrt = std::sqrt(biasCorrection2);
  at::Tensor second = state.expAvgSq;
  if (spec_.amsgrad) { // the largest second moment so far
    at::maximum_out(state.maxExpAvgSq, state.maxExpAvgSq, state.expAvgSq);
    second = state.maxExpAvgSq;
  }
  at::Tensor denom = (second.sqrt() / biasCorrection2Sqrt).add_(spec_.eps);
  p.addcdiv_(state.expAvg, denom, -stepSize);
}

void Optimizer::sgd(const at::Tensor &param, at::Tensor grad, ParamState &state) {
  // torch/optim/sgd.py::_single_tensor_sgd (maximize=False).
  at::Tensor p = param;
  if (spec_.weightDecay != 0)
    grad = grad.add(p, spec_.weightDecay);
  if (spec_.momentum != 0) {
    if (!state.momentum.defined())
      state.momentum = grad.clone().detach();
    else
      state.momentum.mul_(spec_.momentum).add_(grad, 1 - spec_.dampening);
    grad = spec_.nesterov ? grad.add(state.momentum, spec_.momentum) : state.momentum;
  }
  state.step += 1;
  p.add_(grad, -lr_);
}

void Optimizer::rmsprop(const at::Tensor &param, at::Tensor grad, ParamState &state,
                        const c10::Scalar &lr) {
  // torch/optim/rmsprop.py::_single_tensor_rmsprop (maximize=False). With a learning rate on
  // the device (CUDA, scheduled), as its capturable path does with a tensor lr.
  at::Tensor p = param;
  if (!state.expAvgSq.defined()) {
    state.expAvgSq = torch::zeros_like(p, at::MemoryFormat::Preserve); // square_avg
    if (spec_.momentum > 0)
      state.momentum = torch::zeros_like(p, at::MemoryFormat::Preserve);
    if (spec_.centered)
      state.gradAvg = torch::zeros_like(p, at::MemoryFormat::Preserve);
  }
  if (state.deviceStep.defined())
    state.deviceStep.add_(1);
  else
    state.step += 1;
  if (spec_.weightDecay != 0)
    grad = grad.add(p, spec_.weightDecay);
  state.expAvgSq.mul_(spec_.alpha).addcmul_(grad, grad, 1 - spec_.alpha);
  at::Tensor avg;
  if (spec_.centered) {
    state.gradAvg.lerp_(grad, 1 - spec_.alpha);
    avg = state.expAvgSq.addcmul(state.gradAvg, state.gradAvg, -1).sqrt_();
  } else {
    avg = state.expAvgSq.sqrt();
  }
  avg.add_(spec_.eps);
  const bool onDevice = lrTensor_.defined();
  if (spec_.momentum > 0) {
    state.momentum.mul_(spec_.momentum).addcdiv_(grad, avg);
    if (onDevice)
      p.add_(state.momentum * -lrTensor_);
    else
      p.add_(state.momentum, -lr.toDouble());
  } else if (onDevice) {
    p.addcdiv_(grad, avg.div_(-lrTensor_));
  } else {
    p.addcdiv_(grad, avg, -lr.toDouble());
  }
}

void Optimizer::rmspropStep(const std::vector<std::string> &names,
                            const std::vector<at::Tensor> &parameters,
                            const std::vector<at::Tensor> &grads, const at::Tensor &foundInf) {
  // CUDA has no fused RMSprop: its single-tensor arithmetic, every step count on the device and
  // no host synchronisation, so a captured graph holds it. A loss scaler's flag skips it
  // elementwise: the step is computed and kept where the flag is clear.
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (!grads[i].defined())
      continue;
    ParamState &state = state_[names[i]];
    if (!state.deviceStep.defined())
      state.deviceStep =
          torch::full({}, state.step, parameters[i].options().dtype(torch::kFloat32));
    if (!foundInf.defined()) {
      rmsprop(parameters[i], grads[i], state, lr_);
      continue;
    }
    ParamState before = state;
    for (at::Tensor *t : {&before.expAvgSq, &before.momentum, &before.gradAvg, &before.deviceStep})
      if (t->defined())
        *t = t->clone();
    const at::Tensor previous = parameters[i].clone();
    rmsprop(parameters[i], grads[i], state, lr_);
    const at::Tensor skip = foundInf != 0;
    parameters[i].copy_(at::where(skip, previous, parameters[i]));
    for (auto [now, old] :
         {std::pair{&state.expAvgSq, &before.expAvgSq},
          std::pair{&state.momentum, &before.momentum}, std::pair{&state.gradAvg, &before.gradAvg},
          std::pair{&state.deviceStep, &before.deviceStep}})
      if (now->defined() && old->defined())
        now->copy_(at::where(skip, *old, *now));
  }
}

void Optimizer::fusedStep(const std::vector<std::string> &names,
                          const std::vector<at::Tensor> &parameters,
                          const std::vector<at::Tensor> &gradients, const at::Tensor &foundInf) {
  std::vector<at::Tensor> params, grads, expAvgs, expAvgSqs, maxExpAvgSqs, momenta, steps;
  bool firstSgdStep = false;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor &p = parameters[i];
    if (!gradients[i].defined())
      continue;
    ParamState &state = state_[names[i]];
    if (!state.deviceStep.defined())
      state.deviceStep = torch::full({}, state.step, p.options().dtype(torch::kFloat32));
    params.push_back(p);
    grads.push_back(gradients[i]);
    steps.push_back(state.deviceStep);
    if (spec_.type == "sgd") {
      firstSgdStep |= !state.momentum.defined();
      if (!state.momentum.defined())
        state.momentum = torch::empty_like(p, at::MemoryFormat::Preserve);
      momenta.push_back(state.momentum);
      continue;
    }
    if (!state.expAvg.defined()) {
      state.expAvg = torch::zeros_like(p, at::MemoryFormat::Preserve);
      state.expAvgSq = torch::zeros_like(p, at::MemoryFormat::Preserve);
      if (spec_.amsgrad)
        state.maxExpAvgSq = torch::zeros_like(p, at::MemoryFormat::Preserve);
    }
    expAvgs.push_back(state.expAvg);
    expAvgSqs.push_back(state.expAvgSq);
    if (spec_.amsgrad)
      maxExpAvgSqs.push_back(state.maxExpAvgSq);
  }
  if (params.empty())
    return;
  at::_foreach_add_(steps, 1);
  // With a loss scaler's flag the kernels leave parameters and state alone where it is set,
  // and the step counts go back (torch.optim's _fused_adam does the same).
  const std::optional<at::Tensor> found =
      foundInf.defined() ? std::optional<at::Tensor>(foundInf) : std::nullopt;
  // A scheduled learning rate is read from its device tensor (torch's tensor-lr overloads).
  auto launch = [&](const auto &lr) {
    if (spec_.type == "sgd") {
      // torch.optim.SGD(fused=True): the first step copies the gradient into the momentum
      // buffer; later steps (the captured ones) update it.
      at::_fused_sgd_(params, grads,
                      spec_.momentum != 0 ? at::TensorList(momenta) : at::TensorList(),
                      spec_.weightDecay, spec_.momentum, lr, spec_.dampening, spec_.nesterov, false,
                      firstSgdStep, std::nullopt, found);
    } else if (spec_.type == "adamw") {
      at::_fused_adamw_(params, grads, expAvgs, expAvgSqs, maxExpAvgSqs, steps, lr, spec_.beta1,
                        spec_.beta2, spec_.weightDecay, spec_.eps, spec_.amsgrad, false,
                        std::nullopt, found);
    } else {
      at::_fused_adam_(params, grads, expAvgs, expAvgSqs, maxExpAvgSqs, steps, lr, spec_.beta1,
                       spec_.beta2, spec_.weightDecay, spec_.eps, spec_.amsgrad, false,
                       std::nullopt, found);
    }
  };
  if (lrTensor_.defined())
    launch(lrTensor_);
  else
    launch(lr_);
  if (found)
    at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *found));
}

c10::impl::GenericDict Optimizer::stateDict() const {
  c10::impl::GenericDict perParam = makeDict();
  for (const auto &[name, s] : state_) {
    c10::impl::GenericDict entry = makeDict();
    entry.insert("step", s.deviceStep.defined() ? s.deviceStep.cpu()
                                                : torch::tensor(s.step, torch::kFloat32));
    // torch.optim's names: RMSprop's second moment is its square_avg.
    if (s.expAvg.defined())
      entry.insert("exp_avg", s.expAvg.cpu());
    if (s.expAvgSq.defined())
      entry.insert(spec_.type == "rmsprop" ? "square_avg" : "exp_avg_sq", s.expAvgSq.cpu());
    if (s.maxExpAvgSq.defined())
      entry.insert("max_exp_avg_sq", s.maxExpAvgSq.cpu());
    if (s.gradAvg.defined())
      entry.insert("grad_avg", s.gradAvg.cpu());
    if (s.momentum.defined())
      entry.insert("momentum_buffer", s.momentum.cpu());
    perParam.insert(name, entry);
  }
  c10::impl::GenericDict hyper = makeDict();
  hyper.insert("type", spec_.type);
  hyper.insert("lr", lr_);
  hyper.insert("initial_lr", spec_.lr);
  hyper.insert("betas", std::vector<double>{spec_.beta1, spec_.beta2});
  hyper.insert("eps", spec_.eps);
  hyper.insert("weight_decay", spec_.weightDecay);
  hyper.insert("momentum", spec_.momentum);
  hyper.insert("amsgrad", spec_.amsgrad);
  hyper.insert("nesterov", spec_.nesterov);
  hyper.insert("dampening", spec_.dampening);
  hyper.insert("alpha", spec_.alpha);
  hyper.insert("centered", spec_.centered);
  c10::impl::GenericDict out = makeDict();
  out.insert("state", perParam);
  out.insert("hyper", hyper);
  return out;
}

void Optimizer::loadStateDict(const c10::impl::GenericDict &dict) {
  state_.clear();
  for (const auto &item : dict.at("state").toGenericDict()) {
    auto entry = item.value().toGenericDict();
    ParamState s;
    s.step = entry.at("step").toTensor().item<double>();
    const c10::Device device = device_;
    if (device.is_cuda())
      s.deviceStep = torch::full({}, s.step, at::TensorOptions(device).dtype(torch::kFloat32));
    const auto take = [&](const char *key, at::Tensor &into) {
      if (entry.contains(key))
        into = entry.at(key).toTensor().to(device);
    };
    take("exp_avg", s.expAvg);
    take("exp_avg_sq", s.expAvgSq);
    take("square_avg", s.expAvgSq);
    take("max_exp_avg_sq", s.maxExpAvgSq);
    take("grad_avg", s.gradAvg);
    take("momentum_buffer", s.momentum);
    state_[item.key().toStringRef()] = s;
  }
}

namespace {

std::vector<at::Tensor> definedOnly(const std::vector<at::Tensor> &tensors) {
  std::vector<at::Tensor> defined;
  for (const at::Tensor &t : tensors)
    if (t.defined())
      defined.push_back(t);
  return defined;
}

} // namespace

at::Tensor localNormPart(const std::vector<at::Tensor> &gradients, double normType) {
  torch::NoGradGuard noGrad;
  // A rank's piece of a parameter smaller than the world is empty: it adds nothing (and an
  // infinity norm of nothing is undefined).
  std::vector<at::Tensor> grads;
  for (const at::Tensor &g : definedOnly(gradients))
    if (g.numel() > 0)
      grads.push_back(g);
  if (grads.empty())
    return at::Tensor();
  at::Tensor norms = at::stack(at::_foreach_norm(grads, normType)).to(at::kDouble);
  return std::isinf(normType) ? norms.max() : norms.pow(normType).sum();
}

void scaleByNorm(const std::vector<at::Tensor> &gradients, const at::Tensor &combined,
                 double maxNorm, double normType) {
  torch::NoGradGuard noGrad;
  std::vector<at::Tensor> grads = definedOnly(gradients);
  if (grads.empty())
    return;
  at::Tensor total = std::isinf(normType) ? combined : combined.pow(1.0 / normType);
  total = total.to(grads.front().scalar_type());
  at::Tensor coefficient = at::clamp((total + 1e-6).reciprocal() * maxNorm, std::nullopt, 1.0);
  at::_foreach_mul_(grads, coefficient);
}

void Optimizer::keepPieces(const std::map<std::string, at::Tensor> &parameters, int64_t ranks,
                           int64_t rank) {
  torch::NoGradGuard noGrad;
  for (auto &[name, state] : state_) {
    const at::Tensor &p = parameters.at(name);
    const ir::Piece piece = ir::pieceOf(p.numel(), ranks, rank);
    for (at::Tensor *t :
         {&state.expAvg, &state.expAvgSq, &state.maxExpAvgSq, &state.momentum, &state.gradAvg}) {
      if (!t->defined())
        continue;
      // In the parameter's memory order, as the pieces are cut.
      at::Tensor laidOut = at::empty_strided(p.sizes(), p.strides(), t->options()).copy_(*t);
      *t = backend::flatView(laidOut).narrow(0, piece.begin, piece.length).clone();
    }
  }
}

void clipGradNorm(const std::vector<at::Tensor> &gradients, double maxNorm, double normType) {
  torch::NoGradGuard noGrad;
  std::vector<at::Tensor> grads = definedOnly(gradients);
  if (grads.empty())
    return;
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, normType);
  at::Tensor total = at::linalg_vector_norm(at::stack(norms), normType);
  // Python's `max_norm / (total + 1e-6)` is Tensor.__rtruediv__: reciprocal, then multiply.
  at::Tensor coefficient = at::clamp((total + 1e-6).reciprocal() * maxNorm, std::nullopt, 1.0);
  at::_foreach_mul_(grads, coefficient);
}

} // namespace ganc::runtime
