// A `ganc train --profile` file, read by `ganc simulate` and by `ganc compile --bucket-cap-mb
// auto`.
#pragma once

#include "ir/Module.h"
#include "ir/Status.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ganc::tools {

struct ProfiledBucket {
  int64_t bytes = 0;
  double ready = 0; // seconds into the phase
};

/// One phase's medians: seconds from its start.
struct ProfiledPhase {
  std::string key;
  int64_t runs = 0;   // in the profiled run's `steps`
  double compute = 0; // forward and backward
  double optimizer = 0;
  std::vector<ProfiledBucket> buckets;          // by bucket index (the profiled plan's)
  std::map<std::string, double> parameterReady; // each used parameter's gradient
};

struct Profile {
  std::string device; // "cpu" or "cuda"
  int64_t worldSize = 1, threads = 1, steps = 1;
  std::vector<ProfiledPhase> phases;
};

/// What a profile must share with the plan it is read for.
enum class ProfileOf {
  Model, ///< the plan's model (its phases may be bucketed anew: autotuning)
  Plan,  ///< the plan itself: every profiled phase is the plan's, with the plan's buckets
};

/// Reads the profile at `path`, checked against `plan`; every error is one line naming `path`.
Expected<Profile> readProfile(const std::string &path, const ir::Module &plan, ProfileOf match);

} // namespace ganc::tools
