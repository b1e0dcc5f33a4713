// `ganc metrics`: a finished run's snapshot scored with FID and KID.
#pragma once

#include "support/Options.h"

#include <string>
#include <vector>

namespace ganc::tools {

/// The documentation of `ganc metrics`'s options (--help, docs/cli.md).
CommandDoc metricsCommandDoc();

/// Scores a run's snapshot, on this rank and torchrun's peers, or on --nproc local ranks.
int metricsCommand(const std::string &self, const std::vector<std::string> &args);

/// --metrics' value (fid50k,kid50k) appended to `out`, each name checked; a bad one throws
/// OptionError naming it.
void appendMetricNames(const std::string &value, std::vector<std::string> &out);

} // namespace ganc::tools
