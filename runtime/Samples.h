// Sample grids: the spec's sampling submodule on fixed noise, written as PNG by rank 0.
#pragma once

#include "runtime/Setup.h"

namespace ganc::runtime {

/// Writes samples_step<step>.png and samples.png (rank 0; other ranks do nothing). The
/// generator runs in eval mode, so BatchNorm statistics are not touched by sampling.
Status writeSamples(Session &session, int64_t step, bool last);

} // namespace ganc::runtime
