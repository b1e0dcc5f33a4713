// Human-readable and JSON views of a compiled plan (used by `ganc explain` and `--emit`).
#pragma once

#include "ir/Module.h"

#include <string>

namespace ganc::tools {

/// Per phase: used and unused parameters with sizes, buckets in all-reduce order, and the
/// bytes all-reduced per iteration.
std::string explain(const ir::Module &plan);

/// One line after a compile: the plan written to `path`, its phases, parameters trained and
/// bytes all-reduced per run.
std::string summary(const ir::Module &plan, const std::string &path);

/// The plan's facts (no graphs) as JSON, for other tools.
std::string planJson(const ir::Module &plan);

/// "1.50 MiB" style sizes.
std::string humanBytes(int64_t bytes);

} // namespace ganc::tools
