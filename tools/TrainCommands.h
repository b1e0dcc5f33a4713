// `ganc train` (one rank) and `ganc run` (N local ranks): their command lines.
#pragma once

#include "support/Options.h"

#include <string>
#include <vector>

namespace ganc::tools {

/// The documentation of `ganc train`'s and `ganc run`'s options (--help, docs/cli.md).
CommandDoc trainCommandDoc();
CommandDoc runCommandDoc();

/// One rank of training; rank and world come from torchrun's environment variables.
int trainCommand(const std::vector<std::string> &args);

/// Starts N local ranks of `self train ...` on a free port and waits for all of them.
int runCommand(const std::string &self, const std::vector<std::string> &args);

} // namespace ganc::tools
