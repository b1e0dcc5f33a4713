// `ganc metrics`: a run's snapshot scored with the metrics training computes.
#pragma once

#include "support/Status.h"

#include <string>
#include <vector>

namespace ganc::runtime {

struct ScoreOptions {
  /// A run directory (its checkpoint.pt) or a checkpoint file in one (beside its run.json).
  std::string target;
  std::vector<std::string> metrics;
  /// "" : defaultInceptionPath().
  std::string inception;
  /// Over run.json's: the plan, the archive, the data set, the device.
  std::string plan, model, data, device;
  /// Print the results as one JSON object (else one line per metric).
  bool json = false;
  int threads = 0;
};

/// Loads the run's plan, archive and data as run.json records them, the snapshot's weights
/// (G_ema included), and computes the metrics on this rank and its peers (torchrun's
/// variables, or one rank); rank 0 prints them. Errors are bad input (exit 2) before the
/// metrics start, runtime failures after.
Status scoreSnapshot(const ScoreOptions &options);

} // namespace ganc::runtime
