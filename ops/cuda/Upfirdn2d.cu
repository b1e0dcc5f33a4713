// ganc::upfirdn2d on CUDA, two kernels: the direct one (one thread per output sample, visiting
// only the taps that fall on a sample of the input: the zero insertion and the padding are
// never materialised) and the tiled one (ops/cuda/Upfirdn2dTile.h: each block's input patch and
// taps in shared memory, several outputs per thread). The arithmetic in float (double for
// float64). Any strides: contiguous and channels-last tensors alike.
#include "ops/cuda/Elements.cuh"
#include "ops/cuda/Kernels.h"
#include "ops/cuda/Upfirdn2dTile.h"

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

/// The kernels' element loads and stores for the tile code (host and device: the tile's
/// functions are both).
struct DeviceIO {
  __host__ __device__ static float load(const __half &v) { return __half2float(v); }
  __host__ __device__ static float load(const __nv_bfloat16 &v) { return __bfloat162float(v); }
  __host__ __device__ static float load(const float &v) { return v; }
  __host__ __device__ static double load(const double &v) { return v; }
  __host__ __device__ static void store(__half &out, float v) { out = __float2half_rn(v); }
  __host__ __device__ static void store(__nv_bfloat16 &out, float v) {
    out = __float2bfloat16_rn(v);
  }
  __host__ __device__ static void store(float &out, float v) { out = v; }
  __host__ __device__ static void store(double &out, double v) { out = v; }
};

template <typename T, typename Tl>
__global__ void __launch_bounds__(tile::kThreads)
    upfirdn2dTiledKernel(const tile::Geometry g, const double *weights, const T *x, T *y) {
  using A = typename Arithmetic<T>::type;
  extern __shared__ double sharedMemory[]; // double: aligned for either arithmetic
  A *taps = reinterpret_cast<A *>(sharedMemory);
  A *patch = taps + g.tapsX * g.tapsY;
  Tl::loadTaps(g, weights, taps, threadIdx.x, blockDim.x);
  for (int64_t plane = blockIdx.z; plane < g.planes; plane += gridDim.z) {
    const tile::Block b{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), plane};
    Tl::template loadPatch<DeviceIO>(g, b, x, patch, threadIdx.x, blockDim.x);
    __syncthreads();
    Tl::template compute<DeviceIO>(g, b, patch, taps, y, threadIdx.x, blockDim.x);
    __syncthreads(); // the next plane's patch overwrites this one's
  }
}

/// The tile code's description of a resampling.
tile::Geometry geometryOf(const Upfirdn2dArgs &args) {
  tile::Geometry g;
  g.batch = args.batch;
  g.channels = args.channels;
  g.height = static_cast<int>(args.height);
  g.width = static_cast<int>(args.width);
  g.outHeight = static_cast<int>(args.outHeight);
  g.outWidth = static_cast<int>(args.outWidth);
  for (int d = 0; d < 4; ++d) {
    g.xStride[d] = args.xStride[d];
    g.yStride[d] = args.yStride[d];
  }
  g.upX = args.upX;
  g.upY = args.upY;
  g.downX = args.downX;
  g.downY = args.downY;
  g.padX0 = args.padX0;
  g.padY0 = args.padY0;
  g.tapsX = args.tapColumns;
  g.tapsY = args.tapRows;
  return g;
}

} // namespace

cudaError_t upfirdn2dTiled(const Upfirdn2dArgs &args, Dtype dtype, cudaStream_t stream) {
  if (args.batch * args.channels * args.outHeight * args.outWidth == 0)
    return cudaSuccess;
  return byDtype(dtype, [&](auto *tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Arithmetic<T>::type;
    tile::Geometry g = geometryOf(args);
    if (!tile::plan(g, sizeof(A)) || g.tilesY > 65535)
      return cudaErrorInvalidValue; // the caller takes another kernel
    const dim3 grid(static_cast<unsigned>(g.tilesX), static_cast<unsigned>(g.tilesY),
                    static_cast<unsigned>(std::min<int64_t>(g.planes, 65535)));
    const size_t shared = static_cast<size_t>(g.sharedElements()) * sizeof(A);
    tile::byShape(g, [&](auto tileOfShape) {
      using Tl = decltype(tileOfShape);
      upfirdn2dTiledKernel<T, Tl><<<grid, tile::kThreads, shared, stream>>>(
          g, args.weights, static_cast<const T *>(args.x), static_cast<T *>(args.y));
    });
    return cudaGetLastError();
  });
}

bool upfirdn2dTiles(const Upfirdn2dArgs &args, int elementBytes) {
  tile::Geometry g = geometryOf(args);
  return tile::plan(g, elementBytes == 8 ? 8 : 4) && g.tilesY <= 65535;
}

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
