// Checkpoints: written and resumed as one symmetric pair, so that --resume continues bit for
// bit (weights, buffers, optimizer states, every rank's noise generator, the data position).
#pragma once

#include "runtime/Session.h"
#include "runtime/data/Inputs.h"

namespace ganc::runtime {

/// Writes `outDir/checkpoint.pt` for `step` steps done. Every rank takes part (the noise
/// generator states are gathered); rank 0 writes, atomically.
Status writeCheckpoint(Session &session, PhaseInputs &inputs, int64_t step);

/// Writes `outDir/checkpoint-best.pt` for `step` steps done (the step whose metric is the best
/// so far): checkpoint.pt's bytes where `written` says it was written at this step, else a
/// checkpoint made anew (every rank takes part).
Status writeBestCheckpoint(Session &session, PhaseInputs &inputs, int64_t step, bool written);

/// Restores what writeCheckpoint wrote to `path` and returns the steps done; rank 0 says so
/// where `announce`.
Expected<int64_t> resumeCheckpoint(Session &session, PhaseInputs &inputs, const std::string &path,
                                   bool announce = true);

/// Every rank starts at the same step from the same checkpoint (none: step 0): the step and
/// the digest of what each resumed are all-gathered (every rank takes part), and where they
/// differ every rank stops with one line naming each rank's start. Node-local --out folders
/// with different contents would otherwise train on with different weights. The digests of the
/// data sets the ranks loaded are compared too: data that differs between ranks stops every rank.
Status checkRanksStartAlike(Session &session, int64_t step, uint64_t dataDigest);

} // namespace ganc::runtime
