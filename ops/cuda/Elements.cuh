// Loading and storing the kernels' element types in their arithmetic's precision.
#pragma once

#include "ops/cuda/Kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace ganc::ops::cuda {

template <typename T> struct Arithmetic { using type = float; };
template <> struct Arithmetic<double> { using type = double; };

__device__ inline float load(const __half &v) { return __half2float(v); }
__device__ inline float load(const __nv_bfloat16 &v) { return __bfloat162float(v); }
__device__ inline float load(const float &v) { return v; }
__device__ inline double load(const double &v) { return v; }

template <typename T> __device__ inline T store(float v);
template <> __device__ inline __half store<__half>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 store<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ inline float store<float>(float v) { return v; }
template <typename T> __device__ inline T store(double v) { return static_cast<T>(v); }

/// Calls `launch` with a null pointer of the element type of `dtype` (the type is the call's
/// tag); cudaErrorInvalidValue for a dtype without one.
template <typename Launch> cudaError_t byDtype(Dtype dtype, Launch &&launch) {
  switch (dtype) {
  case Dtype::Float16:
    return launch(static_cast<__half *>(nullptr));
  case Dtype::BFloat16:
    return launch(static_cast<__nv_bfloat16 *>(nullptr));
  case Dtype::Float32:
    return launch(static_cast<float *>(nullptr));
  case Dtype::Float64:
    return launch(static_cast<double *>(nullptr));
  }
  return cudaErrorInvalidValue;
}

/// Threads per block of the element-wise kernels, and the blocks that cover `total` elements
/// (grid-stride loops take the rest beyond 2^30 blocks).
constexpr int kThreads = 256;
inline unsigned blocksFor(int64_t total) {
  return static_cast<unsigned>(
      std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t(1) << 30));
}

} // namespace ganc::ops::cuda
