// Convolutions that are differentiated twice (R1, path length, gradient penalties): the
// ganc::convolution op, whose double backward is written with the weight-gradient kernels
// of `convolution_backward`, and the rewrite of a phase graph's grouped convolutions into it.
//
// PyTorch's double backward of a grouped convolution (`_convolution_double_backward`) works
// out its weight-gradient term one group at a time: one convolution per channel, whose
// "kernel" is the whole output image, whether or not the weight needs a gradient. A
// depthwise FIR filter (StyleGAN2's upfirdn2d on its reference path) makes that about 4,000
// convolutions per R1 step at 256 pixels; on an H100 that step took 1.28 s at batch 4 where
// this formulation takes 76 ms (bench/double_backward_probe.py). The first backward is
// PyTorch's own kernels, one call per gradient (the same numbers); the second backward's
// terms are the ones PyTorch computes too, less the weight gradient of a weight that takes
// none, so for such weights (FIR filters) the result is PyTorch's bit for bit.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <cstddef>

namespace ganc::frontend {

/// Whether `graph` differentiates inside itself (a torch.autograd.grad call: aten::grad),
/// so that its backward is differentiated again.
bool differentiatesTwice(const torch::jit::Graph &graph);

/// Replaces each convolution of `graph` whose groups are not the constant 1
/// (aten::_convolution, aten::convolution, aten::conv{1,2,3}d and
/// aten::conv_transpose{1,2,3}d, in nested blocks too) by ganc::convolution, which runs the
/// same forward. Convolutions with string padding ("same") are left alone. Returns how many
/// it replaced. The op differentiates with its own formulation those whose weight takes no
/// gradient (FIR filters: every term it computes is PyTorch's, bit for bit), and with
/// `weightGradients` every one (grouped modulated convolutions too: the second-order weight
/// gradient then differs from PyTorch's by rounding).
size_t rewriteGroupedConvolutions(torch::jit::Graph &graph, bool weightGradients);

} // namespace ganc::frontend
