// `ganc simulate`: a plan's step time at other world sizes, from a measured profile and an
// alpha-beta model of ring all-reduce.
#pragma once

#include "support/Options.h"

#include <string>
#include <vector>

namespace ganc::tools {

/// The documentation of its options (--help, docs/cli.md).
CommandDoc simulateCommandDoc();

/// ganc simulate PLAN --profile TIMING.json --gpus 1,8,64 [options]; exit 2 on bad input.
int simulateCommand(const std::vector<std::string> &args);

} // namespace ganc::tools
