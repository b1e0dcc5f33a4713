// The ops' CUDA kernels (ops/cuda/) registered with the dispatcher: the tensors checked and
// described to the kernels here, where LibTorch is.
#include "ops/Ops.h"
#include "ops/OpsInternal.h"
#include "ops/cuda/Kernels.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdlib>
#include <string>

namespace ganc::ops {
namespace {

cuda::Dtype dtypeOf(const at::Tensor &t) {
  switch (t.scalar_type()) {
  case at::kHalf:
    return cuda::Dtype::Float16;
  case at::kBFloat16:
    return cuda::Dtype::BFloat16;
  case at::kFloat:
    return cuda::Dtype::Float32;
  case at::kDouble:
    return cuda::Dtype::Float64;
  default:
    TORCH_CHECK(false, "ganc ops: no CUDA kernel for ", t.scalar_type(),
                " (float16, bfloat16, float32, float64)");
  }
}

void check(cudaError_t status, const char *op) {
  TORCH_CHECK(status == cudaSuccess, op, ": ", cudaGetErrorString(status));
}

/// Outputs up to which ganc's direct kernel resamples; above, cuDNN's convolutions.
constexpr int64_t kDirectOutputs = int64_t{1} << 20;

/// The tiled kernel runs every resampling it takes (ops/cuda/Upfirdn2dTile.h), the default since it
/// was timed on an H200 (bench/results/resample_probe.json, StyleGAN2's calls at 256 pixels,
/// forward and image gradient: 1.93x the reference compositions at batch 32 and 2.12x at batch 4,
/// where the direct kernel and cuDNN's convolutions measured 1.35x at batch 32).
/// GANC_UPFIRDN2D_KERNEL=direct keeps to those two, for comparison.
bool tiledKernelTaken() {
  static const bool taken = [] {
    const char *kernel = std::getenv("GANC_UPFIRDN2D_KERNEL");
    return !(kernel && std::string(kernel) == "direct");
  }();
  return taken;
}

at::Tensor upfirdn2dCuda(const at::Tensor &x, const at::Tensor &f, c10::IntArrayRef up,
                         c10::IntArrayRef down, c10::IntArrayRef padding, bool flipFilter,
                         double gain, c10::string_view /*origin*/) {
  const Resampling r = detail::resampling(up, down, padding, flipFilter, gain);
  const std::array<int64_t, 2> out = detail::checkedOutputSize(x, f, r);
  const std::array<int64_t, 2> taps = detail::taps(f);
  TORCH_CHECK(f.device() == x.device(), "ganc::upfirdn2d: the filter is on ", f.device(), ", x on ",
              x.device());
  const c10::cuda::CUDAGuard device(x.device());
  // Measured on an H200 (bench/resample_probe.py, StyleGAN2 at 256 pixels): cuDNN's depthwise
  // kernels beat the direct kernel below from about a million outputs (6 ms against 22 for a
  // [32, 64, 256, 256] float16 image), the direct kernel wins below (one launch, no padding).
  const bool tiled = tiledKernelTaken();
  if (!tiled && x.size(0) * x.size(1) * out[0] * out[1] > kDirectOutputs)
    return detail::upfirdn2dByConvolution(x, f, r);
  at::Tensor y = at::empty({x.size(0), x.size(1), out[0], out[1]},
                           x.options().memory_format(x.suggest_memory_format()));
  cuda::Upfirdn2dArgs a;
  a.x = x.data_ptr();
  a.y = y.data_ptr();
  a.batch = x.size(0);
  a.channels = x.size(1);
  a.height = x.size(2);
  a.width = x.size(3);
  a.outHeight = out[0];
  a.outWidth = out[1];
  for (int d = 0; d < 4; ++d) {
    a.xStride[d] = x.stride(d);
    a.yStride[d] = y.stride(d);
  }
  a.upX = static_cast<int>(r.up[0]);
  a.upY = static_cast<int>(r.up[1]);
  a.downX = static_cast<int>(r.down[0]);
  a.downY = static_cast<int>(r.down[1]);
  a.padX0 = static_cast<int>(r.padding[0]);
  a.padY0 = static_cast<int>(r.padding[2]);
  a.tapRows = static_cast<int>(taps[0]);
  a.tapColumns = static_cast<int>(taps[1]);
  const at::Tensor w = detail::correlationKernel(f, r);
  a.weights = w.data_ptr<double>();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (tiled && cuda::upfirdn2dTiles(a, x.scalar_type() == at::kDouble ? 8 : 4))
    check(cuda::upfirdn2dTiled(a, dtypeOf(x), stream), "ganc::upfirdn2d (tiled)");
  else if (tiled && x.size(0) * x.size(1) * out[0] * out[1] > kDirectOutputs)
    return detail::upfirdn2dByConvolution(x, f, r);
  else
    check(cuda::upfirdn2d(a, dtypeOf(x), stream), "ganc::upfirdn2d");
  return y;
}

at::Tensor biasActCuda(const at::Tensor &grad, const at::Tensor &xIn,
                       const c10::optional<at::Tensor> &bIn, int64_t dim, c10::string_view act,
                       double alpha, double gain, double clamp) {
  Activation activation{};
  auto [x, b] = detail::biasActInputs(xIn, bIn, dim, act, activation);
  at::Tensor g = grad;
  detail::laidOutAlike(g, x);
  const c10::cuda::CUDAGuard device(x.device());
  at::Tensor out = at::empty_like(x);
  cuda::BiasActArgs a;
  a.x = x.data_ptr();
  a.bias = b.defined() ? b.data_ptr() : nullptr;
  a.grad = g.defined() ? g.data_ptr() : nullptr;
  a.out = out.data_ptr();
  a.numel = x.numel();
  a.stride = b.defined() ? x.stride(dim) : 1;
  a.size = b.defined() ? x.size(dim) : 1;
  a.act = static_cast<int>(activation);
  a.alpha = alpha;
  a.gain = gain;
  a.clamp = clamp;
  check(cuda::biasAct(a, dtypeOf(x), at::cuda::getCurrentCUDAStream()), "ganc::bias_act");
  return out;
}

at::Tensor biasActForwardCuda(const at::Tensor &x, const c10::optional<at::Tensor> &b, int64_t dim,
                              c10::string_view act, double alpha, double gain, double clamp) {
  return biasActCuda(at::Tensor(), x, b, dim, act, alpha, gain, clamp);
}

} // namespace

TORCH_LIBRARY_IMPL(ganc, CUDA, m) {
  m.impl("upfirdn2d", upfirdn2dCuda);
  m.impl("bias_act", biasActForwardCuda);
  m.impl("bias_act_backward", biasActCuda);
}

} // namespace ganc::ops
