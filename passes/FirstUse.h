// Where each parameter is first consumed in a phase: shared by ready-order and bucketing.
#pragma once

#include "ir/Module.h"

#include <limits>
#include <map>
#include <string>

namespace ganc::passes {

/// The first op (in program order, nested regions included) that consumes a parameter.
struct FirstUse {
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  int64_t opIndex = kNever;
  size_t operandIndex = 0;
};

/// First use of every parameter the phase reads; parameters of one op share an opIndex.
std::map<std::string, FirstUse> firstUses(const ir::Phase &phase);

} // namespace ganc::passes
