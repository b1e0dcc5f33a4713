// Sample grids: the spec's sampling submodule on fixed noise, or its sampling method on fixed
// inputs, written as PNG by rank 0.
#pragma once

#include "runtime/Session.h"
#include "runtime/data/Inputs.h"

namespace ganc::runtime {

/// Rank 0, before training (where samples are drawn): the spec's sampler run once on a batch
/// of the grid's inputs, so that a sample block pointing at the wrong submodule or method,
/// or with the wrong inputs, is bad input now, not a failure at the first sample step.
Status checkSampler(Session &session, const PhaseInputs &inputs);

/// Writes samples_step<step>.png and samples.png (rank 0; other ranks do nothing). The
/// sampler runs in eval mode (or, with `mode: train`, in training mode with every buffer put
/// back afterwards), so BatchNorm statistics are not touched by sampling.
Status writeSamples(Session &session, const PhaseInputs &inputs, int64_t step, bool last);

/// The sample graph of ganc's own archive (session.sampler) run on `args`, the sampler's
/// inputs in its order, with the module's parameters and buffers: what the sampler's call
/// returned (a tensor, or a tuple of them). Throws naming the graph's node on failure.
c10::IValue runSampler(Session &session, const std::vector<c10::IValue> &args);

/// Writes reals.png, the data set's first samples as the grids show fakes (each field beside
/// the others where the sample has fields of one shape), as StyleGAN's training loop does at
/// its start (rank 0, where samples are drawn; other ranks do nothing).
Status writeReals(Session &session, const PhaseInputs &inputs);

} // namespace ganc::runtime
