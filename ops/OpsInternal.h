// What the ops' CPU and CUDA registrations share: argument checks, shapes, filter weights.
#pragma once

#include "ops/Ops.h"

#include <array>
#include <vector>

namespace ganc::ops::detail {

/// A filter's {rows, columns} of taps (a 1-D filter of K taps is K x K).
std::array<int64_t, 2> taps(const at::Tensor &f);

/// The resampling of the op's arguments, checked (2 factors each, at least 1; 4 paddings).
Resampling resampling(c10::IntArrayRef up, c10::IntArrayRef down, c10::IntArrayRef padding,
                      bool flipFilter, double gain);

/// The output's {height, width}; a clear error for inputs that are not [N, C, H, W], a filter
/// that is not 1-D or 2-D, or a padding that leaves nothing.
std::array<int64_t, 2> checkedOutputSize(const at::Tensor &x, const at::Tensor &f,
                                         const Resampling &r);

/// The 2-D correlation weights, rows x columns, gain included (a 1-D filter's outer product).
std::vector<double> correlationWeights(const at::Tensor &f, const Resampling &r);

/// bias_act's arguments, checked: the activation, x's dtype promoted with b's, b's length and
/// dim against x. Returns {x, b} in the promoted dtype (b undefined where none).
std::array<at::Tensor, 2> biasActInputs(const at::Tensor &x, const c10::optional<at::Tensor> &b,
                                        int64_t &dim, c10::string_view act, Activation &a);

/// x, and grad where defined (cast to x's dtype, checked to be of x's sizes), laid out alike
/// and densely: what the element-wise kernels walk by storage offset.
void laidOutAlike(at::Tensor &grad, at::Tensor &x);

} // namespace ganc::ops::detail
