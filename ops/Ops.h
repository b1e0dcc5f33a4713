// ganc's own operators (declared in ops/Ops.def): the resampling StyleGAN writes as pad,
// zero insertion, a depthwise FIR convolution and a strided slice (upfirdn2d), and bias +
// activation + gain + clamp (bias_act), each one kernel per device, with autograd to every
// order. The fusion rewrite replaces the reference compositions by them.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/string_view.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <array>
#include <string>
#include <vector>

namespace ganc::ops {

/// One resampling: upsample by zero insertion (up), pad (negative: crop) by padding = {x0,
/// x1, y0, y1}, filter, keep every down-th sample. With flipFilter false the filter is
/// convolved (StyleGAN's convention), with it true correlated (what conv2d computes). gain
/// scales the result.
struct Resampling {
  std::array<int64_t, 2> up{1, 1};   // {x, y}
  std::array<int64_t, 2> down{1, 1}; // {x, y}
  std::array<int64_t, 4> padding{0, 0, 0, 0};
  bool flipFilter = false;
  double gain = 1.0;

  /// The output's {height, width} for an input of `height` x `width` and a filter of
  /// `taps` = {rows, columns}.
  std::array<int64_t, 2> outputSize(int64_t height, int64_t width,
                                    std::array<int64_t, 2> taps) const;
  /// The resampling whose result is this one's gradient with respect to its input, for an
  /// input of `height` x `width` and a filter of `taps`: the filter flipped, up and down
  /// swapped, the padding that lands every gradient on its input pixel.
  Resampling gradient(int64_t height, int64_t width, std::array<int64_t, 2> taps) const;
};

/// ganc::upfirdn2d through the dispatcher (autograd and autocast included): x is [N, C, H, W]
/// (any strides), f a constant filter, 2-D [rows, columns] or 1-D [taps] (applied to rows and
/// columns). `origin` names the op it replaced, for autocast.
at::Tensor upfirdn2d(const at::Tensor &x, const at::Tensor &f, const Resampling &r,
                     c10::string_view origin = "aten::conv2d");

/// The activations bias_act computes.
enum class Activation { Linear, Relu, LeakyRelu };

/// The activation named `name` ("linear", "relu", "lrelu"); false where there is none.
bool activationNamed(c10::string_view name, Activation &out);

/// ganc::bias_act through the dispatcher: clamp(act(x + b) * gain, -clamp, clamp), b (if
/// defined) broadcast along `dim`; clamp < 0 clamps nothing.
at::Tensor biasAct(const at::Tensor &x, const c10::optional<at::Tensor> &b, int64_t dim,
                   c10::string_view act, double alpha, double gain, double clamp);

/// The process group ganc::sync_batch_norm reduces over (one per process; the runtime sets it
/// at start-up). Without one, or at world size 1, the op is batch norm itself.
void setSyncBatchNormGroup(c10::intrusive_ptr<c10d::Backend> group);

/// One row of ops/Ops.def.
struct OpInfo {
  const char *name;
  const char *schema;
  const char *autocast;
  const char *what;
};

/// Every op of ops/Ops.def, in its order.
const std::vector<OpInfo> &table();

/// Whether autocast for the device of `key` casts the inputs of `origin` ("aten::conv2d",
/// "aten::_convolution.deprecated"): whether that op has a kernel of its own for `key`. The
/// lists differ by device (on the CPU conv2d is cast, aten::convolution and the 13-argument
/// aten::_convolution are not).
bool autocastCasts(c10::DispatchKey key, c10::string_view origin);

} // namespace ganc::ops
