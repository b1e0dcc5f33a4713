// The EMA copy of a trained submodule.
#include "runtime/step/Ema.h"

#include <algorithm>
#include <cmath>

namespace ganc::runtime {

std::unique_ptr<Ema> Ema::create(Session &session) {
  const frontend::Spec &spec = session.spec();
  if (!spec.ema)
    return nullptr;
  const frontend::EmaSpec &ema = *spec.ema;
  auto e = std::make_unique<Ema>();
  e->imagesPerStep_ = static_cast<double>(session.stepImages()); // StyleGAN's batch
  e->halfLife_ = ema.halfLifeImages;
  e->rampup_ = ema.rampup;
  e->beta_ =
      ema.halfLifeImages > 0 ? std::pow(0.5, e->imagesPerStep_ / ema.halfLifeImages) : ema.beta;
  auto trained = session.module().attr(ema.submodule).toModule();
  auto average = session.module().attr(ema.copy).toModule();
  auto tp = trained.named_parameters(), ap = average.named_parameters();
  for (auto a = ap.begin(), t = tp.begin(); a != ap.end(); ++a, ++t) {
    e->averages_.push_back((*a).value);
    e->trained_.push_back((*t).value);
  }
  auto tb = trained.named_buffers(), ab = average.named_buffers();
  for (auto a = ab.begin(), t = tb.begin(); a != ab.end() && t != tb.end(); ++a, ++t) {
    e->bufferAverages_.push_back((*a).value);
    e->bufferTrained_.push_back((*t).value);
  }
  return e;
}

void Ema::update(int64_t imagesSeen) {
  torch::NoGradGuard noGrad;
  if (rampup_ > 0) // train.py: ema_nimg = min(ema_nimg, cur_nimg * ema_rampup)
    beta_ = std::pow(
        0.5, imagesPerStep_ /
                 std::max(std::min(halfLife_, static_cast<double>(imagesSeen) * rampup_), 1e-8));
  // Multi-tensor kernels: a handful of launches for the whole copy, not two per tensor.
  at::_foreach_copy_(averages_, at::_foreach_lerp(trained_, averages_, beta_));
  if (!bufferAverages_.empty())
    at::_foreach_copy_(bufferAverages_, bufferTrained_);
}

} // namespace ganc::runtime
