// ganc::upfirdn2d on CUDA: one thread per output sample, visiting only the taps that fall on
// a sample of the input (the zero insertion and the padding are never materialised), with
// the arithmetic in float (double for float64). Any strides: contiguous and channels-last
// tensors alike.
#include "ops/cuda/Elements.cuh"
#include "ops/cuda/Kernels.h"

#include <type_traits>

namespace ganc::ops::cuda {
namespace {

/// The first tap k >= 0 with (start + k) a multiple of `up` (start may be negative).
__device__ inline int firstTap(int64_t start, int up) {
  const int64_t r = (-start) % up;
  return static_cast<int>(r < 0 ? r + up : r);
}

template <typename T> __global__ void upfirdn2dKernel(const Upfirdn2dArgs args) {
  using acc_t = typename Arithmetic<T>::type;
  const T *x = static_cast<const T *>(args.x);
  T *y = static_cast<T *>(args.y);
  const int64_t total = args.batch * args.channels * args.outHeight * args.outWidth;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ox = i % args.outWidth;
    const int64_t oy = (i / args.outWidth) % args.outHeight;
    const int64_t c = (i / (args.outWidth * args.outHeight)) % args.channels;
    const int64_t n = i / (args.outWidth * args.outHeight * args.channels);
    const T *plane = x + n * args.xStride[0] + c * args.xStride[1];
    const int64_t sy = oy * args.downY - args.padY0, sx = ox * args.downX - args.padX0;
    acc_t sum = 0;
    for (int ky = firstTap(sy, args.upY); ky < args.tapRows; ky += args.upY) {
      const int64_t iy = (sy + ky) / args.upY;
      if (iy < 0 || iy >= args.height)
        continue;
      const T *row = plane + iy * args.xStride[2];
      const double *w = args.weights + ky * args.tapColumns;
      for (int kx = firstTap(sx, args.upX); kx < args.tapColumns; kx += args.upX) {
        const int64_t ix = (sx + kx) / args.upX;
        if (ix < 0 || ix >= args.width)
          continue;
        sum += load(row[ix * args.xStride[3]]) * static_cast<acc_t>(w[kx]);
      }
    }
    y[n * args.yStride[0] + c * args.yStride[1] + oy * args.yStride[2] + ox * args.yStride[3]] =
        store<T>(sum);
  }
}

} // namespace

cudaError_t upfirdn2d(const Upfirdn2dArgs &args, Dtype dtype, cudaStream_t stream) {
  const int64_t total = args.batch * args.channels * args.outHeight * args.outWidth;
  if (total == 0)
    return cudaSuccess;
  return byDtype(dtype, [&](auto *tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    upfirdn2dKernel<T><<<blocksFor(total), kThreads, 0, stream>>>(args);
    return cudaGetLastError();
  });
}

} // namespace ganc::ops::cuda
