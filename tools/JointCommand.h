// `ganc joint`: one captured phase (ganc.joint's op list) run on given tensors.
#pragma once

#include "support/Options.h"

#include <string>
#include <vector>

namespace ganc::tools {

/// The documentation of `ganc joint`'s options (--help, docs/cli.md).
CommandDoc jointCommandDoc();

/// Reads a joint graph, says what it computes and, with --inputs, runs it through the
/// dispatcher and writes its outputs.
int jointCommand(const std::vector<std::string> &args);

} // namespace ganc::tools
