// Sample grids: the spec's sampling submodule on fixed noise, written as PNG by rank 0.
#pragma once

#include "runtime/Setup.h"

namespace ganc::runtime {

/// Rank 0, before training (where samples are drawn): the spec's sampling submodule run once
/// on a batch of the grid's noise, so that a sample block pointing at the wrong submodule or
/// with the wrong noise shape is bad input now, not a failure at the first sample step.
Status checkSampler(Session &session);

/// Writes samples_step<step>.png and samples.png (rank 0; other ranks do nothing). The
/// generator runs in eval mode, so BatchNorm statistics are not touched by sampling.
Status writeSamples(Session &session, int64_t step, bool last);

} // namespace ganc::runtime
