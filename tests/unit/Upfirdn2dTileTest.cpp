// The tiled upfirdn2d's tile code (ops/cuda/Upfirdn2dTile.h), built for the host and run block
// after block with the CUDA kernel's partition, against the reference composition NVIDIA's
// networks run (zero insertion, padding or cropping, a depthwise convolution with the filter,
// stride): forward, backward (the op again at the gradient's resampling) and double backward,
// the references' derivatives by autograd, in float64 and float32, contiguous and
// channels-last, for every resampling StyleGAN2's and StyleGAN3's networks make and for
// random ones.
#include "ops/cuda/Upfirdn2dTile.h"
#include "ops/Ops.h"
#include "ops/OpsInternal.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>
#include <string>
#include <vector>

namespace ganc::ops {
namespace {

struct Case {
  std::string name;
  std::vector<int64_t> shape;  // [N, C, H, W]
  std::vector<int64_t> filter; // 1-D {K} or 2-D {rows, columns}
  Resampling r;
};

Resampling resampling(std::array<int64_t, 2> up, std::array<int64_t, 2> down,
                      std::array<int64_t, 4> padding, double gain, bool flip = false) {
  Resampling r;
  r.up = up;
  r.down = down;
  r.padding = padding;
  r.gain = gain;
  r.flipFilter = flip;
  return r;
}

/// NVIDIA's reference path: zero insertion, constant padding (negative: a crop), a depthwise
/// convolution with the correlation weights, the stride.
at::Tensor reference(const at::Tensor &x, const at::Tensor &f, const Resampling &r) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  at::Tensor xu = at::zeros({n, c, h * r.up[1], w * r.up[0]}, x.options());
  xu.slice(2, 0, c10::nullopt, r.up[1]).slice(3, 0, c10::nullopt, r.up[0]).copy_(x);
  const at::Tensor padded =
      at::constant_pad_nd(xu, {r.padding[0], r.padding[1], r.padding[2], r.padding[3]});
  const at::Tensor k = detail::correlationKernel(f, r).to(x.scalar_type());
  const at::Tensor weights =
      k.reshape({1, 1, k.size(0), k.size(1)}).expand({c, 1, k.size(0), k.size(1)});
  const std::vector<int64_t> stride = {r.down[1], r.down[0]}, none = {0, 0}, one = {1, 1};
  return at::conv2d(padded, weights.contiguous(), at::Tensor(), stride, none, one, c);
}

/// The tiled resampling on the host, in x's dtype and layout.
at::Tensor tiled(const at::Tensor &x, const at::Tensor &f, const Resampling &r) {
  const std::array<int64_t, 2> taps = detail::taps(f);
  const std::array<int64_t, 2> out = r.outputSize(x.size(2), x.size(3), taps);
  at::Tensor y = at::empty({x.size(0), x.size(1), out[0], out[1]},
                           x.options().memory_format(x.suggest_memory_format()));
  tile::Geometry g;
  g.batch = x.size(0);
  g.channels = x.size(1);
  g.height = static_cast<int>(x.size(2));
  g.width = static_cast<int>(x.size(3));
  g.outHeight = static_cast<int>(out[0]);
  g.outWidth = static_cast<int>(out[1]);
  for (int d = 0; d < 4; ++d) {
    g.xStride[d] = x.stride(d);
    g.yStride[d] = y.stride(d);
  }
  g.upX = static_cast<int>(r.up[0]);
  g.upY = static_cast<int>(r.up[1]);
  g.downX = static_cast<int>(r.down[0]);
  g.downY = static_cast<int>(r.down[1]);
  g.padX0 = static_cast<int>(r.padding[0]);
  g.padY0 = static_cast<int>(r.padding[2]);
  g.tapsX = static_cast<int>(taps[1]);
  g.tapsY = static_cast<int>(taps[0]);
  const bool wide = x.scalar_type() == at::kDouble;
  EXPECT_TRUE(tile::plan(g, wide ? 8 : 4));
  const at::Tensor weights = detail::correlationKernel(f, r);
  if (wide)
    tile::runOnHost<double>(g, weights.data_ptr<double>(), x.data_ptr<double>(),
                            y.data_ptr<double>());
  else
    tile::runOnHost<float>(g, weights.data_ptr<double>(), x.data_ptr<float>(), y.data_ptr<float>());
  return y;
}

double relative(const at::Tensor &got, const at::Tensor &want) {
  const double scale = want.abs().max().item<double>();
  return (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>() /
         (scale > 0 ? scale : 1);
}

/// Forward, backward and double backward of one case in one dtype and layout: the tile code
/// against the reference and its autograd derivatives.
void check(const Case &k, at::ScalarType dtype, bool channelsLast) {
  SCOPED_TRACE(k.name + (dtype == at::kDouble ? " float64" : " float32") +
               (channelsLast ? " channels-last" : " contiguous"));
  const double tolerance = dtype == at::kDouble ? 1e-12 : 1e-5;
  const auto format = channelsLast ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  torch::manual_seed(7);
  const at::Tensor f = torch::rand(k.filter, at::kDouble) + 0.1; // the filter: a constant
  at::Tensor x = torch::randn(k.shape, at::kDouble).to(dtype).contiguous(format);
  // Forward.
  const at::Tensor want = reference(x, f, k.r);
  ASSERT_EQ(tiled(x, f, k.r).sizes(), want.sizes());
  EXPECT_LE(relative(tiled(x, f, k.r), want), tolerance) << "forward";
  // Backward: the op at the gradient's resampling, against autograd through the reference.
  const std::array<int64_t, 2> taps = detail::taps(f);
  const Resampling g = k.r.gradient(x.size(2), x.size(3), taps);
  const at::Tensor gy = torch::randn(want.sizes(), at::kDouble).to(dtype).contiguous(format);
  const at::Tensor xv = x.detach().requires_grad_(true);
  const at::Tensor gx = torch::autograd::grad({reference(xv, f, k.r)}, {xv}, {gy}, true, true)[0];
  EXPECT_LE(relative(tiled(gy, f, g), gx), tolerance) << "backward";
  // Double backward: the backward's derivative with respect to the incoming gradient, applied
  // to v, is the forward resampling of v again.
  const at::Tensor v = torch::randn(x.sizes(), at::kDouble).to(dtype).contiguous(format);
  const at::Tensor gyv = gy.detach().requires_grad_(true);
  const at::Tensor gxv = torch::autograd::grad({reference(xv, f, k.r)}, {xv}, {gyv}, true, true)[0];
  const at::Tensor ggy = torch::autograd::grad({gxv}, {gyv}, {v}, true)[0];
  EXPECT_LE(relative(tiled(v, f, k.r), ggy), tolerance) << "double backward";
}

void checkAll(const std::vector<Case> &cases) {
  for (const Case &k : cases)
    for (at::ScalarType dtype : {at::kDouble, at::kFloat})
      for (bool channelsLast : {false, true})
        check(k, dtype, channelsLast);
}

// Every (filter, up, down, padding, gain) StyleGAN2's G and D at 256 pixels call (recorded by
// bench/resample_probe.py): the blur after the transposed convolution and around D's strided
// ones, 2x up of the skip connections' images, 2x down of D's residuals.
TEST(Upfirdn2dTile, StyleGAN2Resamplings) {
  checkAll({
      {"blur pad 1 gain 4", {2, 5, 17, 17}, {4}, resampling({1, 1}, {1, 1}, {1, 1, 1, 1}, 4)},
      {"blur pad 2", {2, 5, 35, 35}, {4}, resampling({1, 1}, {1, 1}, {2, 2, 2, 2}, 1)},
      {"down 2", {2, 5, 34, 34}, {4}, resampling({1, 1}, {2, 2}, {1, 1, 1, 1}, 1)},
      {"up 2", {2, 3, 16, 16}, {4}, resampling({2, 2}, {1, 1}, {2, 1, 2, 1}, 4)},
  });
}

// StyleGAN3's filtered_lrelu on its reference path, as ganc's fusion takes it: its upsampling
// (2x with a 12-tap filter, 4x with 24 taps in the layers that double the resolution) and its
// downsampling (2x, 12 taps), 2-D (the outer product of the 1-D filter, and stylegan3-r's
// radial filters), and each as two separable passes ([1, K] and [K, 1] filters).
TEST(Upfirdn2dTile, StyleGAN3Resamplings) {
  checkAll({
      {"up 2, 12 taps", {1, 3, 20, 20}, {12}, resampling({2, 2}, {1, 1}, {11, 10, 11, 10}, 4)},
      {"up 4, 24 taps", {1, 2, 12, 12}, {24}, resampling({4, 4}, {1, 1}, {22, 21, 22, 21}, 16)},
      {"down 2, 12 taps", {1, 3, 44, 44}, {12}, resampling({1, 1}, {2, 2}, {-5, -5, -5, -5}, 1)},
      {"radial 12 x 12, up 2",
       {1, 2, 18, 18},
       {12, 12},
       resampling({2, 2}, {1, 1}, {11, 10, 11, 10}, 4)},
      {"pass along x, up 2",
       {1, 3, 20, 20},
       {1, 12},
       resampling({2, 1}, {1, 1}, {11, 10, 0, 0}, 2)},
      {"pass along y, up 2",
       {1, 3, 20, 20},
       {12, 1},
       resampling({1, 2}, {1, 1}, {0, 0, 11, 10}, 2)},
      {"pass along x, down 2",
       {1, 3, 40, 40},
       {1, 12},
       resampling({1, 1}, {2, 1}, {-5, -5, 0, 0}, 1)},
      {"pass along y, up 4",
       {1, 2, 10, 10},
       {24, 1},
       resampling({1, 4}, {1, 1}, {0, 0, 22, 21}, 4)},
  });
}

// Random resamplings: factors 1 to 4 and taps 1 to 8 per dimension, paddings from a crop to
// beyond the filter, flipped or not, images from smaller than a tile to several tiles, odd
// channel counts (channels-last blocks take several channels, the last group short).
TEST(Upfirdn2dTile, RandomResamplings) {
  std::mt19937 rng(2026);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<Case> cases;
  while (cases.size() < 24) {
    Case k;
    const int kx = pick(1, 8), ky = pick(1, 8);
    k.filter = {ky, kx};
    k.r = resampling({pick(1, 4), pick(1, 4)}, {pick(1, 4), pick(1, 4)},
                     {pick(-2, kx + 2), pick(-2, kx + 2), pick(-2, ky + 2), pick(-2, ky + 2)},
                     pick(1, 4), pick(0, 1) == 1);
    k.shape = {pick(1, 2), pick(1, 19), pick(3, 40), pick(3, 40)};
    const std::array<int64_t, 2> out = k.r.outputSize(k.shape[2], k.shape[3], {ky, kx});
    if (out[0] <= 0 || out[1] <= 0)
      continue;
    k.name = "random " + std::to_string(cases.size());
    cases.push_back(k);
  }
  checkAll(cases);
}

// A tile smaller than 32 x 32 where the patch would not fit (many taps, a large down factor),
// and the channels-last blocks' channel groups.
TEST(Upfirdn2dTile, PlansFitSharedMemory) {
  tile::Geometry g;
  g.batch = 2;
  g.channels = 40;
  g.xStride[1] = 1; // channels-last
  g.outHeight = g.outWidth = 64;
  g.downX = g.downY = 4;
  g.tapsX = g.tapsY = 24;
  ASSERT_TRUE(tile::plan(g, 8));
  EXPECT_TRUE(g.channelsInner);
  EXPECT_LE(g.sharedElements() * 8, tile::kSharedBytes);
  EXPECT_LT(g.tileW, 16);
  EXPECT_EQ(g.planes, 2 * ((40 + g.channelsPerBlock - 1) / g.channelsPerBlock));
  tile::Geometry big = g;
  big.tapsX = big.tapsY = 200; // no tile of one channel fits: the caller takes another kernel
  EXPECT_FALSE(tile::plan(big, 8));
}

} // namespace
} // namespace ganc::ops
