// Fusion: the resampling and the bias + activation GAN code writes by hand, found in a phase's
// TorchScript graph and replaced by ganc's own ops (ops/Ops.def), whose gradients are ganc ops
// again, so R1's and path length's double backward stay fused too.
//
// Resampling (StyleGAN's reference upfirdn2d, conv2d_resample, rosinality's upfirdn2d_native):
//   reshape x to [N, C, H, 1, W, 1], pad [0, ux-1, 0, 0, 0, uy-1], reshape to [N, C, H*uy, W*ux]
//   (zero insertion, optional); F.pad (optional); a convolution whose weight is a constant 2-D
//   filter f unsqueezed to [1, 1, kh, kw] and repeated over the channels (groups = C), or not
//   (groups = 1, the channels folded into the batch); x[:, :, ::dy, ::dx] (optional)
//   -> ganc::upfirdn2d(x, f, [ux, uy], [dx, dy], padding, flip_filter=true, gain=1).
// Bias + activation (StyleGAN's reference bias_act, and the same written inline):
//   x + b.reshape([1, -1, 1, 1]) (optional), leaky_relu / relu (optional), * a constant gain
//   (optional), clamp(-c, c) (optional), at least two of them
//   -> ganc::bias_act(x, b, dim, act, alpha, gain, clamp).
// A filter is constant when nothing it is computed from is a parameter or an input of the
// phase; every value a match consumes must have no other use. What resembles a pattern but is
// left alone (a learned filter, a stride or padding that is not a constant, an upsampling
// whose sizes are not the input's) is reported with why.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ganc::frontend {

/// A pattern left alone, with why and where (the user's file:line, where the graph knows it).
struct NearMiss {
  std::string pattern; // "upfirdn2d", "bias_act"
  std::string why;
};

/// What fusing one phase graph did.
struct FusionReport {
  int64_t resamplings = 0; // ganc::upfirdn2d nodes made
  int64_t biasActs = 0;    // ganc::bias_act nodes made
  std::vector<NearMiss> nearMisses;
};

/// Fuses `graph` (inlined, constants propagated) in place. `isParameter(v)` says whether a
/// value is a parameter of the model (prim::GetAttr of one): a filter computed from one is
/// learned, not a resampling filter.
FusionReport fuse(torch::jit::Graph &graph,
                  const std::function<bool(const torch::jit::Value *)> &isParameter);

} // namespace ganc::frontend
