// File helpers every command shares: read a whole file, write one atomically, read a plan.
#pragma once

#include "ir/Module.h"
#include "ir/Status.h"

#include <memory>
#include <string>
#include <vector>

namespace ganc {

/// The bytes of `path`.
Expected<std::vector<char>> readFile(const std::string &path);

/// Writes `bytes` to `path` through a temporary file beside it and a rename, so a failed
/// write never leaves a truncated file where a good one was; the temporary file is removed
/// when anything fails.
Status writeFileAtomically(const std::string &path, const std::vector<char> &bytes);
Status writeFileAtomically(const std::string &path, const std::string &text);

namespace ir {

/// Reads, parses and verifies the plan at `path` (every error names the file).
Expected<std::unique_ptr<Module>> readPlan(const std::string &path);

} // namespace ir
} // namespace ganc
