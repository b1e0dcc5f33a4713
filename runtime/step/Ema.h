// The exponential moving average of a trained submodule (spec 'ema'), updated after every
// step with StyleGAN2's rule: p_ema = p.lerp(p_ema, beta); buffers are copied.
#pragma once

#include "runtime/Session.h"

#include <memory>
#include <vector>

namespace ganc::runtime {

class Ema {
public:
  /// The spec's EMA, or null when it has none. beta comes from the half-life in images
  /// (0.5 ** (images per step / half_life_images), images per step being batch * world *
  /// the data phases' micro-batches) or is the spec's constant.
  static std::unique_ptr<Ema> create(Session &session);
  /// Moves the copy toward the trained submodule (every rank does it identically);
  /// `imagesSeen`: the real images trained on before this step, over every rank (a ramped-up
  /// half-life grows with them).
  void update(int64_t imagesSeen);

private:
  double beta_ = 0;
  double imagesPerStep_ = 0, halfLife_ = 0, rampup_ = 0;
  /// The copy's parameters and buffers, and the trained submodule's, in the same order.
  std::vector<at::Tensor> averages_, trained_, bufferAverages_, bufferTrained_;
};

} // namespace ganc::runtime
