// The tiled upfirdn2d: its tile logic, compiled by nvcc into the CUDA kernel
// (ops/cuda/Upfirdn2d.cu) and by the host compiler into the tests, which run the very same
// functions block after block (tests/unit/Upfirdn2dTileTest.cpp). No CUDA header is needed
// here.
//
// A block computes a tile of tileH x tileW outputs of channelsPerBlock channels of one image:
//   1. its threads load the input patch the tile reads (every input sample a tap of the tile
//      lands on, zero outside the image: the zero insertion and the padding are never
//      materialised) and the taps into shared memory;
//   2. after a barrier each thread computes outputs of the tile (several per thread), reading
//      only shared memory, visiting only the taps that land on an input sample.
// In one dimension, with u = up, d = down, p0 the leading padding and K taps, output o reads
// xu[o*d - p0 + k] = x[(o*d - p0 + k) / u] for the k where u divides o*d - p0 + k. Indices
// inside a tile are 32-bit; the up and down factors and the tap counts are template
// parameters where they are StyleGAN's (0: read at run time). A channels-last tensor is read
// along its channels: a block takes several channels, consecutive threads consecutive ones.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define GANC_TILE_FN __host__ __device__ __forceinline__
#else
#define GANC_TILE_FN inline
#endif

namespace ganc::ops::tile {

/// One resampling and how it is tiled (ganc::ops::tile::plan makes it).
struct Geometry {
  int64_t batch = 0, channels = 0;
  int height = 0, width = 0, outHeight = 0, outWidth = 0;
  int64_t xStride[4] = {0, 0, 0, 0}, yStride[4] = {0, 0, 0, 0};
  int upX = 1, upY = 1, downX = 1, downY = 1, padX0 = 0, padY0 = 0, tapsX = 1, tapsY = 1;
  /// The tiling: outputs per tile, the channels one block takes, the input samples a tile
  /// reads per channel (an upper bound), the blocks.
  int tileW = 32, tileH = 32, channelsPerBlock = 1, patchW = 0, patchH = 0;
  int tilesX = 0, tilesY = 0;
  int64_t planes = 0; // batch * channel groups: the third block index
  /// Channels fastest in shared memory and across threads (a channels-last tensor).
  bool channelsInner = false;

  /// Shared memory a block takes, in elements of the arithmetic's type: taps, then patch.
  int64_t sharedElements() const {
    return static_cast<int64_t>(tapsX) * tapsY +
           static_cast<int64_t>(channelsPerBlock) * patchH * patchW;
  }
};

/// Shared memory a block may take (below the 48 KiB every CUDA device gives without opting in).
constexpr int64_t kSharedBytes = 40 * 1024;
/// Threads per block.
constexpr int kThreads = 256;

/// The tiling of a resampling with `accBytes`-byte arithmetic: 32 x 32 outputs a block for
/// one channel; a channels-last tensor 16 x 16 outputs of up to 16 channels; smaller tiles
/// where a patch would not fit in kSharedBytes. False where even an 8 x 8 tile of one channel
/// does not fit (taps far larger than StyleGAN's).
inline bool plan(Geometry &g, int accBytes) {
  g.channelsInner = g.xStride[1] == 1 && g.channels > 1;
  g.tileW = g.tileH = g.channelsInner ? 16 : 32;
  auto patch = [&](int tile, int down, int taps, int up) {
    return ((tile - 1) * down + taps - 1) / up + 2;
  };
  for (;;) {
    g.patchW = patch(g.tileW, g.downX, g.tapsX, g.upX);
    g.patchH = patch(g.tileH, g.downY, g.tapsY, g.upY);
    const int64_t perChannel = static_cast<int64_t>(g.patchW) * g.patchH * accBytes;
    const int64_t tapBytes = static_cast<int64_t>(g.tapsX) * g.tapsY * accBytes;
    const int64_t room = kSharedBytes - tapBytes;
    if (perChannel <= room) {
      g.channelsPerBlock =
          g.channelsInner ? static_cast<int>(std::min<int64_t>({16, g.channels, room / perChannel}))
                          : 1;
      break;
    }
    if (g.tileW <= 8)
      return false;
    g.tileW /= 2;
    g.tileH /= 2;
  }
  g.tilesX = (g.outWidth + g.tileW - 1) / g.tileW;
  g.tilesY = (g.outHeight + g.tileH - 1) / g.tileH;
  g.planes = g.batch * ((g.channels + g.channelsPerBlock - 1) / g.channelsPerBlock);
  return true;
}

GANC_TILE_FN int floorDiv(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
GANC_TILE_FN int ceilDiv(int a, int b) { return -floorDiv(-a, b); }
/// The first tap k >= 0 with u dividing s + k.
GANC_TILE_FN int firstTap(int s, int u) {
  const int r = (-s) % u;
  return r < 0 ? r + u : r;
}

/// A block's place: its tile's column and row, and its plane (image and channel group).
struct Block {
  int x = 0, y = 0;
  int64_t plane = 0;
};

/// The tile logic with the up and down factors and the tap counts fixed where they are
/// positive (0: the geometry's, at run time).
template <int UX, int UY, int DX, int DY, int KX, int KY> struct Tile {
  GANC_TILE_FN static int upX(const Geometry &g) { return UX > 0 ? UX : g.upX; }
  GANC_TILE_FN static int upY(const Geometry &g) { return UY > 0 ? UY : g.upY; }
  GANC_TILE_FN static int downX(const Geometry &g) { return DX > 0 ? DX : g.downX; }
  GANC_TILE_FN static int downY(const Geometry &g) { return DY > 0 ? DY : g.downY; }
  GANC_TILE_FN static int tapsX(const Geometry &g) { return KX > 0 ? KX : g.tapsX; }
  GANC_TILE_FN static int tapsY(const Geometry &g) { return KY > 0 ? KY : g.tapsY; }

  /// The first input row and column the block's patch holds (its sample [0, 0]).
  GANC_TILE_FN static void patchOrigin(const Geometry &g, const Block &b, int &iy0, int &ix0) {
    iy0 = ceilDiv(b.y * g.tileH * downY(g) - g.padY0, upY(g));
    ix0 = ceilDiv(b.x * g.tileW * downX(g) - g.padX0, upX(g));
  }

  /// The patch's index of row r, column q of channel cg of the block.
  GANC_TILE_FN static int at(const Geometry &g, int r, int q, int cg) {
    return g.channelsInner ? (r * g.patchW + q) * g.channelsPerBlock + cg
                           : (cg * g.patchH + r) * g.patchW + q;
  }

  /// Splits the i-th of the block's count x rows x columns items into (channel, row, column),
  /// the channel fastest where channelsInner.
  GANC_TILE_FN static void item(const Geometry &g, int i, int rows, int columns, int &cg, int &r,
                                int &q) {
    const int cells = rows * columns;
    int cell = i;
    if (g.channelsInner) {
      cg = i % g.channelsPerBlock;
      cell = i / g.channelsPerBlock;
    } else {
      cg = i / cells;
      cell = i % cells;
    }
    r = cell / columns;
    q = cell % columns;
  }

  /// Step 1a: the taps (correlation weights, gain included) into shared memory.
  template <typename A>
  GANC_TILE_FN static void loadTaps(const Geometry &g, const double *weights, A *taps, int thread,
                                    int threads) {
    for (int i = thread; i < tapsX(g) * tapsY(g); i += threads)
      taps[i] = static_cast<A>(weights[i]);
  }

  /// Step 1b: the block's input patch into shared memory, zero outside the image.
  template <typename IO, typename T, typename A>
  GANC_TILE_FN static void loadPatch(const Geometry &g, const Block &b, const T *x, A *patch,
                                     int thread, int threads) {
    int iy0 = 0, ix0 = 0;
    patchOrigin(g, b, iy0, ix0);
    const int64_t groups = (g.channels + g.channelsPerBlock - 1) / g.channelsPerBlock;
    const int64_t n = b.plane / groups, c0 = (b.plane % groups) * g.channelsPerBlock;
    const int count = g.channelsPerBlock * g.patchH * g.patchW;
    for (int i = thread; i < count; i += threads) {
      int cg = 0, r = 0, q = 0;
      item(g, i, g.patchH, g.patchW, cg, r, q);
      const int iy = iy0 + r, ix = ix0 + q;
      const int64_t c = c0 + cg;
      A value = 0;
      if (c < g.channels && iy >= 0 && iy < g.height && ix >= 0 && ix < g.width)
        value = IO::load(
            x[n * g.xStride[0] + c * g.xStride[1] + iy * g.xStride[2] + ix * g.xStride[3]]);
      patch[at(g, r, q, cg)] = value;
    }
  }

  /// Step 2 (after a barrier): the tile's outputs, each a sum over the taps that land on an
  /// input sample, from shared memory only.
  template <typename IO, typename T, typename A>
  GANC_TILE_FN static void compute(const Geometry &g, const Block &b, const A *patch, const A *taps,
                                   T *y, int thread, int threads) {
    int iy0 = 0, ix0 = 0;
    patchOrigin(g, b, iy0, ix0);
    const int64_t groups = (g.channels + g.channelsPerBlock - 1) / g.channelsPerBlock;
    const int64_t n = b.plane / groups, c0 = (b.plane % groups) * g.channelsPerBlock;
    const int count = g.channelsPerBlock * g.tileH * g.tileW;
    const int uy = upY(g), ux = upX(g), ky1 = tapsY(g), kx1 = tapsX(g);
    for (int i = thread; i < count; i += threads) {
      int cg = 0, r = 0, q = 0;
      item(g, i, g.tileH, g.tileW, cg, r, q);
      const int oy = b.y * g.tileH + r, ox = b.x * g.tileW + q;
      const int64_t c = c0 + cg;
      if (oy >= g.outHeight || ox >= g.outWidth || c >= g.channels)
        continue;
      const int sy = oy * downY(g) - g.padY0, sx = ox * downX(g) - g.padX0;
      const int kyFirst = firstTap(sy, uy), kxFirst = firstTap(sx, ux);
      // Each step of u taps moves one input sample: the patch row and column of the first tap.
      const int row0 = (sy + kyFirst) / uy - iy0, column0 = (sx + kxFirst) / ux - ix0;
      A sum = 0;
      for (int ky = kyFirst, pr = row0; ky < ky1; ky += uy, ++pr)
        for (int kx = kxFirst, pq = column0; kx < kx1; kx += ux, ++pq)
          sum += patch[at(g, pr, pq, cg)] * taps[ky * kx1 + kx];
      IO::store(y[n * g.yStride[0] + c * g.yStride[1] + oy * g.yStride[2] + ox * g.yStride[3]],
                sum);
    }
  }
};

/// Calls `run` with the Tile of `g`'s factors and taps: StyleGAN2's resamplings with its
/// 4-tap filter (blur, 2x up, 2x down) fixed at compile time, any other at run time.
template <typename Run> void byShape(const Geometry &g, Run &&run) {
  const bool fourTaps = g.tapsX == 4 && g.tapsY == 4;
  const bool same = g.upX == g.upY && g.downX == g.downY;
  if (fourTaps && same && g.upX == 1 && g.downX == 1)
    run(Tile<1, 1, 1, 1, 4, 4>());
  else if (fourTaps && same && g.upX == 2 && g.downX == 1)
    run(Tile<2, 2, 1, 1, 4, 4>());
  else if (fourTaps && same && g.upX == 1 && g.downX == 2)
    run(Tile<1, 1, 2, 2, 4, 4>());
  else
    run(Tile<0, 0, 0, 0, 0, 0>());
}

/// The host's loads and stores (float and double: what the host runs the tiles in).
struct HostIO {
  static inline float load(float v) { return v; }
  static inline double load(double v) { return v; }
  static inline void store(float &out, float v) { out = v; }
  static inline void store(double &out, double v) { out = v; }
};

/// The tiled resampling run on the host, every block one after another, each block's threads
/// one after another in each step (the barrier between the steps is the loop's end): the
/// CUDA kernel's code and partition, for the tests. T is float or double.
template <typename T>
void runOnHost(const Geometry &g, const double *weights, const T *x, T *y, int threads = kThreads) {
  std::vector<T> shared(static_cast<size_t>(g.sharedElements()));
  T *taps = shared.data(), *patch = shared.data() + g.tapsX * g.tapsY;
  byShape(g, [&](auto tile) {
    using Tl = decltype(tile);
    for (int t = 0; t < threads; ++t)
      Tl::loadTaps(g, weights, taps, t, threads);
    for (int64_t plane = 0; plane < g.planes; ++plane)
      for (int by = 0; by < g.tilesY; ++by)
        for (int bx = 0; bx < g.tilesX; ++bx) {
          const Block b{bx, by, plane};
          for (int t = 0; t < threads; ++t)
            Tl::template loadPatch<HostIO>(g, b, x, patch, t, threads);
          for (int t = 0; t < threads; ++t)
            Tl::template compute<HostIO>(g, b, patch, taps, y, t, threads);
        }
  });
}

} // namespace ganc::ops::tile
