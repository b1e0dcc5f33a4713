// The training loop of one rank: phases by interval, inputs from the spec, optimizers,
// logging, sample grids, checkpoints.
#pragma once

#include "runtime/Options.h"
#include "support/Status.h"

namespace ganc::runtime {

/// Trains this rank to `options.steps`. An error found before the first step is bad input
/// (ErrorKind::BadInput, exit 2); one while training is a runtime failure (exit 1) and
/// names the rank, phase and step.
Status train(const TrainOptions &options);

} // namespace ganc::runtime
