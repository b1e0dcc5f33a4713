// ganc::bias_act and its backward on CUDA: one element per thread, by storage offset, with
// the arithmetic of ops/BiasAct.cpp (the reference's order of operations, in float; double
// for float64).
#include "ops/cuda/Elements.cuh"
#include "ops/cuda/Kernels.h"

#include <type_traits>

namespace ganc::ops::cuda {
namespace {

template <typename acc_t> __device__ inline acc_t activate(acc_t z, int act, acc_t alpha) {
  return act == 0 ? z : (z > 0 ? z : (act == 1 ? acc_t(0) : z * alpha));
}

template <typename T> __global__ void biasActKernel(const BiasActArgs args) {
  using acc_t = typename Arithmetic<T>::type;
  const T *x = static_cast<const T *>(args.x);
  const T *b = static_cast<const T *>(args.bias);
  const T *g = static_cast<const T *>(args.grad);
  T *out = static_cast<T *>(args.out);
  const acc_t alpha = static_cast<acc_t>(args.alpha), gain = static_cast<acc_t>(args.gain),
              clamp = static_cast<acc_t>(args.clamp);
  const bool clamps = args.clamp >= 0, scales = args.gain != 1.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < args.numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // z rounded to T as the reference's x + b is.
    const acc_t z =
        b ? load(store<T>(load(x[i]) + load(b[(i / args.stride) % args.size]))) : load(x[i]);
    acc_t a = activate(z, args.act, alpha);
    if (scales)
      a = a * gain;
    if (!g) {
      if (clamps)
        a = a < -clamp ? -clamp : (a > clamp ? clamp : a);
      out[i] = store<T>(a);
      continue;
    }
    acc_t d = load(g[i]);
    if (clamps && !(a >= -clamp && a <= clamp))
      d = 0;
    if (scales)
      d = d * gain;
    if (args.act == 1)
      d = z > 0 ? d : acc_t(0);
    else if (args.act == 2)
      d = z > 0 ? d : d * alpha;
    out[i] = store<T>(d);
  }
}

} // namespace

cudaError_t biasAct(const BiasActArgs &args, Dtype dtype, cudaStream_t stream) {
  const int64_t total = args.numel;
  if (total == 0)
    return cudaSuccess;
  return byDtype(dtype, [&](auto *tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    biasActKernel<T><<<blocksFor(total), kThreads, 0, stream>>>(args);
    return cudaGetLastError();
  });
}

} // namespace ganc::ops::cuda
