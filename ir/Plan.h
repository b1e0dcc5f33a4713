// Plans on disk: stamped with a checksum after verification, read back checked.
#pragma once

#include "ir/Module.h"

#include <memory>
#include <string>

namespace ganc::ir {

/// `text` (a printed plan) with its checksum line appended: what `ganc compile -o` and
/// `ganc-opt -o` write after verifying the plan.
std::string stampPlan(const std::string &text);

/// Checks the checksum line stampPlan wrote: a plan edited by hand after it was verified, or
/// damaged, is refused before anything parses it.
Status checkPlanStamp(const std::string &text);

/// Reads the plan at `path`, checks its checksum, parses and verifies it (every error names
/// the file).
Expected<std::unique_ptr<Module>> readPlan(const std::string &path);

} // namespace ganc::ir
