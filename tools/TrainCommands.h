// `ganc train` (one rank) and `ganc run` (N local ranks): their command lines.
#pragma once

#include <string>
#include <vector>

namespace ganc::tools {

/// One rank of training; rank and world come from torchrun's environment variables.
int trainCommand(const std::vector<std::string> &args);

/// Starts N local ranks of `self train ...` on a free port and waits for all of them.
int runCommand(const std::string &self, const std::vector<std::string> &args);

} // namespace ganc::tools
