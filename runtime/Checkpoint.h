// Checkpoints: written and resumed as one symmetric pair, so that --resume continues bit for
// bit (weights, buffers, optimizer states, every rank's noise generator, the data position).
#pragma once

#include "runtime/Inputs.h"
#include "runtime/Setup.h"

namespace ganc::runtime {

/// Writes `outDir/checkpoint.pt` for `step` steps done. Every rank takes part (the noise
/// generator states are gathered); rank 0 writes, atomically.
Status writeCheckpoint(Session &session, PhaseInputs &inputs, int64_t step);

/// Restores what writeCheckpoint wrote to `path` and returns the steps done.
Expected<int64_t> resumeCheckpoint(Session &session, PhaseInputs &inputs, const std::string &path);

} // namespace ganc::runtime
