// The ops' CUDA kernels behind a plain interface (no LibTorch here: nvcc compiles these files
// alone; ops/CudaKernels.cpp checks the tensors and registers the kernels with the dispatcher).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ganc::ops::cuda {

/// The element types the kernels take (their arithmetic is in float, double for Float64).
enum class Dtype { Float16, BFloat16, Float32, Float64 };

/// One upfirdn2d: y[n, c, oy, ox] = sum of weights[ky][kx] * xu[oy*down_y + ky - pad_y0,
/// ox*down_x + kx - pad_x0] over the taps that fall on a sample of x (zero-inserted by up).
/// Strides in elements; `weights` (on the device, float64, rows x columns) are the
/// correlation weights, gain included: made on the device, so that no call reads the filter
/// back to the host (a CUDA Graph capture forbids it).
struct Upfirdn2dArgs {
  const void *x = nullptr;
  void *y = nullptr;
  int64_t batch = 0, channels = 0, height = 0, width = 0, outHeight = 0, outWidth = 0;
  int64_t xStride[4] = {0, 0, 0, 0}, yStride[4] = {0, 0, 0, 0};
  int upX = 1, upY = 1, downX = 1, downY = 1, padX0 = 0, padY0 = 0;
  int tapRows = 0, tapColumns = 0;
  const double *weights = nullptr;
};

/// Launches the resampling on `stream` (the direct kernel); the launch's status.
cudaError_t upfirdn2d(const Upfirdn2dArgs &args, Dtype dtype, cudaStream_t stream);
/// Launches the tiled kernel (ops/cuda/Upfirdn2dTile.h) on `stream`; the launch's status.
cudaError_t upfirdn2dTiled(const Upfirdn2dArgs &args, Dtype dtype, cudaStream_t stream);
/// Whether the tiled kernel takes this resampling (its patch fits in shared memory) with
/// elements of `elementBytes` (8: float64's double arithmetic).
bool upfirdn2dTiles(const Upfirdn2dArgs &args, int elementBytes);

/// One bias_act over a dense tensor walked by storage offset: channel (i / stride) % size of
/// bias (null: none). With grad non-null, bias_act_backward: out = d bias_act / dx * grad.
/// act: 0 linear, 1 relu, 2 leaky relu.
struct BiasActArgs {
  const void *x = nullptr, *bias = nullptr, *grad = nullptr;
  void *out = nullptr;
  int64_t numel = 0, stride = 1, size = 1;
  int act = 0;
  double alpha = 0, gain = 1, clamp = -1;
};

/// Launches bias_act (or its backward) on `stream`; the launch's status.
cudaError_t biasAct(const BiasActArgs &args, Dtype dtype, cudaStream_t stream);

} // namespace ganc::ops::cuda
