// Option values more than one command takes, declared once so that the same flag reads the
// same way everywhere (ganc compile, train, simulate and ganc-opt).
#pragma once

#include "ir/Module.h"
#include "support/Options.h"
#include "support/TextFormat.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ganc::tools {

/// A bucket cap in MiB, as bytes: a number in (0, 1048576).
inline int64_t mebibytes(const std::string &flag, const std::string &text) {
  const std::optional<double> mib = parseDouble(text);
  if (!mib || !(*mib > 0) || *mib >= 1048576)
    throw OptionError(flag + " takes a number of MiB in (0, 1048576), not '" + text + "'");
  return static_cast<int64_t>(*mib * 1048576);
}

/// A sharded optimizer state stage.
inline int zeroStage(const std::string &flag, const std::string &text) {
  std::vector<std::pair<std::string, int>> stages;
  for (int stage = 0; stage <= ir::Module::kMaxZeroStage; ++stage)
    stages.push_back({std::to_string(stage), stage});
  return choice<int>(flag, text, stages);
}

/// A world size (1 to 2^24).
inline int64_t worldSize(const std::string &flag, const std::string &text) {
  const std::optional<int64_t> n = parseInt64(text);
  if (!n || *n < 1 || *n > (int64_t{1} << 24))
    throw OptionError(flag + " takes a world size from 1 to 16777216, not '" + text + "'");
  return *n;
}

} // namespace ganc::tools
