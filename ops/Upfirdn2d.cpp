// ganc::upfirdn2d: its shapes, its CPU kernel, its autograd and its autocast rule.
//
// In one dimension, with u = up, d = down, p0 the leading padding, w the correlation weights
// (the filter flipped unless flipFilter) and K taps:
//   y[o] = gain * sum_k w[k] * xu[o*d + k - p0],   xu[s] = x[s / u] where u divides s, else 0
// The gradient with respect to x: dxu[s] = gain * sum_k w[k] * gyd[s + p0 - k] with gyd the
// gradient upsampled by d, i.e. a correlation of gyd with w flipped after a leading padding
// of K - 1 - p0, of which every u-th sample is dx. That is this op again with up and down
// swapped, the filter flipped and the padding of Resampling::gradient, so every derivative
// order (R1 and path length differentiate twice) is one kernel.
#include "ops/Ops.h"
#include "ops/OpsInternal.h"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace ganc::ops {

std::array<int64_t, 2> Resampling::outputSize(int64_t height, int64_t width,
                                              std::array<int64_t, 2> taps) const {
  const int64_t rows = height * up[1] + padding[2] + padding[3] - taps[0];
  const int64_t columns = width * up[0] + padding[0] + padding[1] - taps[1];
  return {rows < 0 ? 0 : rows / down[1] + 1, columns < 0 ? 0 : columns / down[0] + 1};
}

Resampling Resampling::gradient(int64_t height, int64_t width, std::array<int64_t, 2> taps) const {
  const std::array<int64_t, 2> out = outputSize(height, width, taps);
  Resampling g;
  g.up = down;
  g.down = up;
  g.flipFilter = !flipFilter;
  g.gain = gain;
  g.padding = {taps[1] - padding[0] - 1, width * up[0] - out[1] * down[0] + padding[0] - up[0] + 1,
               taps[0] - padding[2] - 1,
               height * up[1] - out[0] * down[1] + padding[2] - up[1] + 1};
  return g;
}

namespace detail {

std::array<int64_t, 2> taps(const at::Tensor &f) {
  return f.dim() == 1 ? std::array<int64_t, 2>{f.size(0), f.size(0)}
                      : std::array<int64_t, 2>{f.size(0), f.size(1)};
}

Resampling resampling(c10::IntArrayRef up, c10::IntArrayRef down, c10::IntArrayRef padding,
                      bool flipFilter, double gain) {
  TORCH_CHECK(up.size() == 2 && down.size() == 2 && padding.size() == 4,
              "ganc::upfirdn2d: up and down take 2 factors (x, y), padding 4 (x0, x1, y0, y1)");
  Resampling r;
  r.up = {up[0], up[1]};
  r.down = {down[0], down[1]};
  r.padding = {padding[0], padding[1], padding[2], padding[3]};
  r.flipFilter = flipFilter;
  r.gain = gain;
  TORCH_CHECK(r.up[0] >= 1 && r.up[1] >= 1 && r.down[0] >= 1 && r.down[1] >= 1,
              "ganc::upfirdn2d: up and down must be at least 1");
  return r;
}

std::array<int64_t, 2> checkedOutputSize(const at::Tensor &x, const at::Tensor &f,
                                         const Resampling &r) {
  TORCH_CHECK(x.dim() == 4, "ganc::upfirdn2d: x must be [N, C, H, W], not ", x.sizes());
  TORCH_CHECK(f.dim() == 1 || f.dim() == 2, "ganc::upfirdn2d: the filter must be 1-D or 2-D, not ",
              f.sizes());
  TORCH_CHECK(f.numel() > 0, "ganc::upfirdn2d: the filter is empty");
  const std::array<int64_t, 2> out = r.outputSize(x.size(2), x.size(3), taps(f));
  TORCH_CHECK(out[0] > 0 && out[1] > 0, "ganc::upfirdn2d: no output for an input of ", x.sizes(),
              ", a filter of ", f.sizes(), " and this padding");
  return out;
}

at::Tensor correlationKernel(const at::Tensor &f, const Resampling &r) {
  at::Tensor w = f.detach().to(at::kDouble);
  if (w.dim() == 1)
    w = w.unsqueeze(1) * w.unsqueeze(0);
  if (!r.flipFilter)
    w = w.flip({0, 1});
  return (w * r.gain).contiguous();
}

at::Tensor upfirdn2dByConvolution(const at::Tensor &x, const at::Tensor &f, const Resampling &r) {
  // The CPU's reduced-precision convolutions do not all sum in float32 (the transposed one
  // rounds as it goes): there the op computes in float32 and rounds once.
  if (!x.is_cuda() && (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16))
    return upfirdn2dByConvolution(x.to(at::kFloat), f, r).to(x.scalar_type());
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const std::array<int64_t, 2> k = taps(f);
  const at::Tensor w = correlationKernel(f, r).to(x.scalar_type());
  const std::vector<int64_t> none = {0, 0}, one = {1, 1};
  const bool up = r.up[0] > 1 || r.up[1] > 1, down = r.down[0] > 1 || r.down[1] > 1;
  // Transposed: y[o] = sum_i x[i] w[u i - o + p0], a transposed convolution with the weights
  // flipped, padding K - 1 - p0 and output padding u + p1 - p0 - 1, where those are valid.
  const std::vector<int64_t> pad = {k[0] - 1 - r.padding[2], k[1] - 1 - r.padding[0]};
  const std::vector<int64_t> extra = {r.up[1] + r.padding[3] - r.padding[2] - 1,
                                      r.up[0] + r.padding[1] - r.padding[0] - 1};
  const bool transposable = up && !down && pad[0] >= 0 && pad[1] >= 0 && extra[0] >= 0 &&
                            extra[1] >= 0 && extra[0] < r.up[1] && extra[1] < r.up[0];
  if (transposable) {
    const at::Tensor weights =
        w.flip({0, 1}).reshape({1, 1, k[0], k[1]}).expand({c, 1, k[0], k[1]});
    const std::vector<int64_t> stride = {r.up[1], r.up[0]};
    return at::conv_transpose2d(x, weights.contiguous(), c10::nullopt, stride, pad, extra, c, one)
        .contiguous(x.suggest_memory_format());
  }
  at::Tensor xu = x;
  if (up) {
    xu = at::zeros({n, c, h * r.up[1], wd * r.up[0]},
                   x.options().memory_format(x.suggest_memory_format()));
    xu.slice(2, 0, c10::nullopt, r.up[1]).slice(3, 0, c10::nullopt, r.up[0]).copy_(x);
  }
  const at::Tensor padded =
      at::constant_pad_nd(xu, {r.padding[0], r.padding[1], r.padding[2], r.padding[3]});
  const at::Tensor weights = w.reshape({1, 1, k[0], k[1]}).expand({c, 1, k[0], k[1]}).contiguous();
  const std::vector<int64_t> stride = {r.down[1], r.down[0]};
  return at::conv2d(padded, weights, c10::nullopt, stride, none, one, c)
      .contiguous(x.suggest_memory_format());
}

} // namespace detail

namespace {

using detail::checkedOutputSize;
using detail::resampling;
using detail::taps;

/// On the CPU, the op is its convolution formulation (mkldnn's depthwise convolution is faster
/// there than a direct loop). Its gradient is still this op (autograd below), so no
/// convolution's double backward is ever taken.
at::Tensor upfirdn2dCpu(const at::Tensor &x, const at::Tensor &f, c10::IntArrayRef up,
                        c10::IntArrayRef down, c10::IntArrayRef padding, bool flipFilter,
                        double gain, c10::string_view /*origin*/) {
  const Resampling r = resampling(up, down, padding, flipFilter, gain);
  checkedOutputSize(x, f, r);
  TORCH_CHECK(x.is_floating_point(), "ganc::upfirdn2d: x must be floating point, not ",
              x.scalar_type());
  return detail::upfirdn2dByConvolution(x, f, r);
}

/// Calls the op below autograd (the kernel of x's device).
at::Tensor callKernel(const at::Tensor &x, const at::Tensor &f, const Resampling &r,
                      c10::string_view origin) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ganc::upfirdn2d", "")
                             .typed<decltype(upfirdn2dCpu)>();
  const std::vector<int64_t> up(r.up.begin(), r.up.end()), down(r.down.begin(), r.down.end()),
      padding(r.padding.begin(), r.padding.end());
  return op.call(x, f, up, down, padding, r.flipFilter, r.gain, origin);
}

class Upfirdn2dFunction : public torch::autograd::Function<Upfirdn2dFunction> {
public:
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                            const at::Tensor &f, const Resampling &r, const std::string &origin) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({f});
    const std::array<int64_t, 2> grad = {x.size(2), x.size(3)};
    const Resampling g = r.gradient(grad[0], grad[1], taps(f));
    ctx->saved_data["up"] = std::vector<int64_t>(g.up.begin(), g.up.end());
    ctx->saved_data["down"] = std::vector<int64_t>(g.down.begin(), g.down.end());
    ctx->saved_data["padding"] = std::vector<int64_t>(g.padding.begin(), g.padding.end());
    ctx->saved_data["flip"] = g.flipFilter;
    ctx->saved_data["gain"] = g.gain;
    ctx->saved_data["origin"] = origin;
    return callKernel(x, f, r, origin);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor f = ctx->get_saved_variables()[0];
    const Resampling g =
        resampling(ctx->saved_data["up"].toIntVector(), ctx->saved_data["down"].toIntVector(),
                   ctx->saved_data["padding"].toIntVector(), ctx->saved_data["flip"].toBool(),
                   ctx->saved_data["gain"].toDouble());
    at::Tensor gx = upfirdn2d(grads[0], f, g, ctx->saved_data["origin"].toStringRef());
    return {gx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor upfirdn2dAutograd(const at::Tensor &x, const at::Tensor &f, c10::IntArrayRef up,
                             c10::IntArrayRef down, c10::IntArrayRef padding, bool flipFilter,
                             double gain, c10::string_view origin) {
  TORCH_CHECK(!f.requires_grad(), "ganc::upfirdn2d: the filter takes no gradient (a learned ",
              "filter is a convolution, not a resampling)");
  const Resampling r = resampling(up, down, padding, flipFilter, gain);
  checkedOutputSize(x, f, r); // before the gradient's resampling reads x's sizes
  return Upfirdn2dFunction::apply(x, f, r, std::string(origin));
}

/// Autocast: x in the autocast dtype where autocast would cast the inputs of the depthwise
/// convolution the op replaced (the filter follows x inside the kernel), else as it is.
template <c10::DeviceType Type, c10::DispatchKey Key>
at::Tensor upfirdn2dAutocast(const at::Tensor &x, const at::Tensor &f, c10::IntArrayRef up,
                             c10::IntArrayRef down, c10::IntArrayRef padding, bool flipFilter,
                             double gain, c10::string_view origin) {
  const c10::impl::ExcludeDispatchKeyGuard noAutocast(Key);
  const Resampling r = resampling(up, down, padding, flipFilter, gain);
  if (!autocastCasts(Key, origin))
    return ops::upfirdn2d(x, f, r, origin);
  return ops::upfirdn2d(at::autocast::cached_cast(at::autocast::get_autocast_dtype(Type), x, Type),
                        f, r, origin);
}

} // namespace

at::Tensor upfirdn2d(const at::Tensor &x, const at::Tensor &f, const Resampling &r,
                     c10::string_view origin) {
  return callKernel(x, f, r, origin);
}

TORCH_LIBRARY_IMPL(ganc, CPU, m) { m.impl("upfirdn2d", upfirdn2dCpu); }
TORCH_LIBRARY_IMPL(ganc, Autograd, m) { m.impl("upfirdn2d", upfirdn2dAutograd); }
TORCH_LIBRARY_IMPL(ganc, AutocastCPU, m) {
  m.impl("upfirdn2d", upfirdn2dAutocast<c10::kCPU, c10::DispatchKey::AutocastCPU>);
}
TORCH_LIBRARY_IMPL(ganc, AutocastCUDA, m) {
  m.impl("upfirdn2d", upfirdn2dAutocast<c10::kCUDA, c10::DispatchKey::AutocastCUDA>);
}

} // namespace ganc::ops
