// ganc::convolution (ops/Ops.def): a convolution whose double backward is written with the
// weight-gradient kernels of `convolution_backward` (frontend/DoubleBackward.h says why and
// when the rewrite puts it in a phase).
//
// The op's autograd, for groups > 1 and a weight that takes no gradient, or any weight with
// weight_gradients (otherwise it is PyTorch's convolution, autograd and all):
//   forward            y  = conv(x, w) + b
//   backward           gx = InputGrad(gy, w)   convolution_backward's input gradient
//                      gw = WeightGrad(gy, x)  convolution_backward's weight gradient
//                      gb = sum of gy over all but the channel dimension
//   InputGrad's        d/dgy = conv(ggx, w);  d/dw = WeightGrad(gy, ggx)
//   WeightGrad's       d/dgy = conv(x, ggw);  d/dx = InputGrad(gy, ggw)
// each conv again this op's autograd, each gradient PyTorch's kernels for the whole
// convolution (every group in one call). For a transposed convolution the same identities
// hold with convolution_backward of the transposed configuration.
#include "ops/Ops.h"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

namespace ganc::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// A convolution's arguments besides its tensors, each list as long as its spatial
/// dimensions.
struct Config {
  std::vector<int64_t> stride, padding, dilation, outputPadding;
  bool transposed = false;
  int64_t groups = 1;
};

std::vector<int64_t> expand(c10::IntArrayRef values, int64_t dims) {
  if (values.size() == 1)
    return std::vector<int64_t>(static_cast<size_t>(dims), values[0]);
  return values.vec();
}

at::Tensor convolve(const at::Tensor &input, const at::Tensor &weight,
                    const std::optional<at::Tensor> &bias, const Config &c) {
  return at::convolution(input, weight, bias, c.stride, c.padding, c.dilation, c.transposed,
                         c.outputPadding, c.groups);
}

/// convolution_backward's gradient of the input (`weightGradient` false) or of the weight.
at::Tensor gradientOf(bool weightGradient, const at::Tensor &gradOutput, const at::Tensor &input,
                      const at::Tensor &weight, const Config &c) {
  const std::array<bool, 3> mask{!weightGradient, weightGradient, false};
  auto grads =
      at::convolution_backward(gradOutput, input, weight, std::nullopt, c.stride, c.padding,
                               c.dilation, c.transposed, c.outputPadding, c.groups, mask);
  return weightGradient ? std::get<1>(grads) : std::get<0>(grads);
}

void save(AutogradContext *ctx, const Config &c) {
  ctx->saved_data["stride"] = c.stride;
  ctx->saved_data["padding"] = c.padding;
  ctx->saved_data["dilation"] = c.dilation;
  ctx->saved_data["output_padding"] = c.outputPadding;
  ctx->saved_data["transposed"] = c.transposed;
  ctx->saved_data["groups"] = c.groups;
}

Config load(AutogradContext *ctx) {
  Config c;
  c.stride = ctx->saved_data["stride"].toIntVector();
  c.padding = ctx->saved_data["padding"].toIntVector();
  c.dilation = ctx->saved_data["dilation"].toIntVector();
  c.outputPadding = ctx->saved_data["output_padding"].toIntVector();
  c.transposed = ctx->saved_data["transposed"].toBool();
  c.groups = ctx->saved_data["groups"].toInt();
  return c;
}

/// y = conv(x, w) + b. Autograd counts only the tensors given as inputs (an absent bias is
/// none), but backward returns one gradient per argument.
class ConvolutionFunction : public torch::autograd::Function<ConvolutionFunction> {
public:
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &input, const at::Tensor &weight,
                            const std::optional<at::Tensor> &bias, const Config &c) {
    ctx->save_for_backward({input, weight});
    save(ctx, c);
    ctx->saved_data["bias"] = bias.has_value() && bias->defined();
    return convolve(input, weight, bias, c);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads);
};

/// gx = convolution_backward's input gradient of gy, with weight w (x: the input, detached:
/// only its shape and layout are read, and no gradient flows to it from here).
class InputGradFunction : public torch::autograd::Function<InputGradFunction> {
public:
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &gradOutput,
                            const at::Tensor &weight, const at::Tensor &input, const Config &c) {
    ctx->save_for_backward({gradOutput, weight, input});
    save(ctx, c);
    return gradientOf(false, gradOutput, input, weight, c);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads);
};

/// gw = convolution_backward's weight gradient of gy over the input x (w: the weight,
/// detached, for its shape and layout).
class WeightGradFunction : public torch::autograd::Function<WeightGradFunction> {
public:
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &gradOutput,
                            const at::Tensor &input, const at::Tensor &weight, const Config &c) {
    ctx->save_for_backward({gradOutput, input, weight});
    save(ctx, c);
    return gradientOf(true, gradOutput, input, weight, c);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads);
};

variable_list ConvolutionFunction::backward(AutogradContext *ctx, variable_list grads) {
  const variable_list saved = ctx->get_saved_variables();
  const at::Tensor &input = saved[0], &weight = saved[1], &gradOutput = grads[0];
  const Config c = load(ctx);
  at::Tensor gradInput, gradWeight, gradBias;
  if (ctx->needs_input_grad(0))
    gradInput = InputGradFunction::apply(gradOutput, weight, input.detach(), c);
  if (ctx->needs_input_grad(1))
    gradWeight = WeightGradFunction::apply(gradOutput, input, weight.detach(), c);
  if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) {
    std::vector<int64_t> dims{0};
    for (int64_t d = 2; d < gradOutput.dim(); ++d)
      dims.push_back(d);
    gradBias = gradOutput.sum(dims);
  }
  return {gradInput, gradWeight, gradBias, at::Tensor()};
}

variable_list InputGradFunction::backward(AutogradContext *ctx, variable_list grads) {
  const variable_list saved = ctx->get_saved_variables();
  const at::Tensor &gradOutput = saved[0], &weight = saved[1], &ggInput = grads[0];
  const Config c = load(ctx);
  at::Tensor forGradOutput, forWeight;
  if (ctx->needs_input_grad(0))
    forGradOutput = ConvolutionFunction::apply(ggInput, weight, std::nullopt, c);
  if (ctx->needs_input_grad(1))
    forWeight = WeightGradFunction::apply(gradOutput, ggInput, weight.detach(), c);
  return {forGradOutput, forWeight, at::Tensor(), at::Tensor()};
}

variable_list WeightGradFunction::backward(AutogradContext *ctx, variable_list grads) {
  const variable_list saved = ctx->get_saved_variables();
  const at::Tensor &gradOutput = saved[0], &input = saved[1], &ggWeight = grads[0];
  const Config c = load(ctx);
  at::Tensor forGradOutput, forInput;
  if (ctx->needs_input_grad(0))
    forGradOutput = ConvolutionFunction::apply(input, ggWeight, std::nullopt, c);
  if (ctx->needs_input_grad(1))
    forInput = InputGradFunction::apply(gradOutput, ggWeight, input.detach(), c);
  return {forGradOutput, forInput, at::Tensor(), at::Tensor()};
}

// The op's kernels: its forward below autograd, its autograd, and autocast's casts (those of
// the convolution it replaced).
at::Tensor convolutionKernel(const at::Tensor &input, const at::Tensor &weight,
                             const std::optional<at::Tensor> &bias, c10::IntArrayRef stride,
                             c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                             c10::IntArrayRef outputPadding, int64_t groups,
                             bool /*weightGradients*/, c10::string_view /*origin*/) {
  return at::convolution(input, weight, bias, stride, padding, dilation, transposed, outputPadding,
                         groups);
}

at::Tensor convolutionAutograd(const at::Tensor &input, const at::Tensor &weight,
                               const std::optional<at::Tensor> &bias, c10::IntArrayRef stride,
                               c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                               c10::IntArrayRef outputPadding, int64_t groups, bool weightGradients,
                               c10::string_view /*origin*/) {
  // PyTorch's double backward makes no per-group convolutions for groups == 1. With a weight
  // that takes a gradient, this formulation's second-order weight gradient is a grouped
  // weight-gradient kernel where PyTorch's sums per-group convolutions: the same to rounding,
  // not bit for bit, so only where asked (--double-backward grouped). Without one, every
  // term computed is PyTorch's own.
  if (groups == 1 || (weight.requires_grad() && !weightGradients))
    return at::convolution(input, weight, bias, stride, padding, dilation, transposed,
                           outputPadding, groups);
  const int64_t dims = weight.dim() - 2;
  const Config c{expand(stride, dims),
                 expand(padding, dims),
                 expand(dilation, dims),
                 expand(outputPadding, dims),
                 transposed,
                 groups};
  return ConvolutionFunction::apply(input, weight, bias, c);
}

at::Tensor callConvolution(const at::Tensor &input, const at::Tensor &weight,
                           const std::optional<at::Tensor> &bias, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                           c10::IntArrayRef outputPadding, int64_t groups, bool weightGradients,
                           c10::string_view origin) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ganc::convolution", "")
                             .typed<decltype(convolutionKernel)>();
  return op.call(input, weight, bias, stride, padding, dilation, transposed, outputPadding, groups,
                 weightGradients, origin);
}

/// Autocast: the floating inputs in the autocast dtype where autocast would cast those of the
/// convolution the op replaced, else as they are.
template <c10::DeviceType Type, c10::DispatchKey Key>
at::Tensor convolutionAutocast(const at::Tensor &input, const at::Tensor &weight,
                               const std::optional<at::Tensor> &bias, c10::IntArrayRef stride,
                               c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                               c10::IntArrayRef outputPadding, int64_t groups, bool weightGradients,
                               c10::string_view origin) {
  const c10::impl::ExcludeDispatchKeyGuard noAutocast(Key);
  if (!autocastCasts(Key, origin))
    return callConvolution(input, weight, bias, stride, padding, dilation, transposed,
                           outputPadding, groups, weightGradients, origin);
  const at::ScalarType to = at::autocast::get_autocast_dtype(Type);
  return callConvolution(at::autocast::cached_cast(to, input, Type),
                         at::autocast::cached_cast(to, weight, Type),
                         at::autocast::cached_cast(to, bias, Type), stride, padding, dilation,
                         transposed, outputPadding, groups, weightGradients, origin);
}

TORCH_LIBRARY_IMPL(ganc, CompositeExplicitAutograd, m) { m.impl("convolution", convolutionKernel); }
TORCH_LIBRARY_IMPL(ganc, Autograd, m) { m.impl("convolution", convolutionAutograd); }
TORCH_LIBRARY_IMPL(ganc, AutocastCPU, m) {
  m.impl("convolution", convolutionAutocast<c10::kCPU, c10::DispatchKey::AutocastCPU>);
}
TORCH_LIBRARY_IMPL(ganc, AutocastCUDA, m) {
  m.impl("convolution", convolutionAutocast<c10::kCUDA, c10::DispatchKey::AutocastCUDA>);
}

} // namespace

} // namespace ganc::ops
