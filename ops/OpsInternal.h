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

/// The 2-D correlation weights, rows x columns, gain included (a 1-D filter's outer product),
/// in float64 on the filter's device (made there: no read back to the host).
at::Tensor correlationKernel(const at::Tensor &f, const Resampling &r);

/// The op as ATen convolutions, on any device: downsampling as the stride of one depthwise
/// convolution with the correlation weights (after the padding, or crop); upsampling, where
/// down is 1, as the stride of one transposed depthwise convolution (the zero-inserted image
/// is never made); both at once by zero insertion, then the strided convolution. The CPU
/// kernel, and the CUDA kernel's for large outputs, where cuDNN's depthwise kernels are faster
/// than ganc's direct one.
at::Tensor upfirdn2dByConvolution(const at::Tensor &x, const at::Tensor &f, const Resampling &r);

/// bias_act's arguments, checked: the activation, x's dtype promoted with b's, b's length and
/// dim against x. Returns {x, b} in the promoted dtype (b undefined where none).
std::array<at::Tensor, 2> biasActInputs(const at::Tensor &x, const c10::optional<at::Tensor> &b,
                                        int64_t &dim, c10::string_view act, Activation &a);

/// x, and grad where defined (cast to x's dtype, checked to be of x's sizes), laid out alike
/// and densely: what the element-wise kernels walk by storage offset.
void laidOutAlike(at::Tensor &grad, at::Tensor &x);

} // namespace ganc::ops::detail
