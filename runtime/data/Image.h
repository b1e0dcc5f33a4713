// Writes a grid of generator samples as a PNG.
#pragma once

#include "support/Status.h"

#include <torch/torch.h>

#include <string>

namespace ganc::runtime {

/// `samples` is [N, C, H, W] (C = 1 or 3) in [-1, 1]; writes a grid of `columns` images a
/// row (0: near-square) to `path` through a temporary file and a rename. Samples that are not
/// images (e.g. 2-D points) are drawn as a scatter plot instead.
Status writeSampleGrid(const at::Tensor &samples, const std::string &path, int64_t columns = 0);

} // namespace ganc::runtime
