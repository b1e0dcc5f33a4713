// A `ganc train --profile` file, read by `ganc simulate` and by `ganc compile --bucket-cap-mb
// auto`.
#pragma once

#include "ir/Module.h"
#include "perf/CommModel.h"
#include "support/Status.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ganc::perf {

/// One phase's medians: seconds from its start.
struct ProfiledPhase {
  std::string key;
  int64_t runs = 0;   // in the profiled run's `steps`
  double compute = 0; // forward and backward
  double optimizer = 0;
  /// When the last collective had completed (all_reduced_seconds; negative when absent).
  double reduced = -1;
  std::map<std::string, double> parameterReady; // each used parameter's gradient
};

struct Profile {
  std::string device; // "cpu" or "cuda"
  int64_t worldSize = 1, threads = 1, steps = 1;
  int zero = 0; // the ZeRO stage the profiled run used
  std::vector<ProfiledPhase> phases;
};

/// Reads the profile at `path`, which must be of `plan`'s model (any bucketing of it: the
/// gradients' ready times do not depend on the buckets): each phase it times one of the plan's,
/// once, with a ready time for each parameter that phase trains, and every time finite and not
/// negative. Every error is one line naming `path` (and the phase and parameter).
Expected<Profile> readProfile(const std::string &path, const ir::Module &plan);

/// "PATH has no timings for phase 'a', 'b' (...)" for the plan's phases the profile does not
/// time (a lazy regulariser of a short run, a stage it did not reach); "" when it times all.
std::string untimedPhases(const ir::Module &plan, const Profile &profile, const std::string &path);

/// `phase`'s buckets as the profiled run would have completed them: each ready when the last
/// of its gradients was (the phase's end for a parameter the profile lacks), in the phase's
/// all-reduce schedule, or, before the schedule is planned, in the order they are ready.
std::vector<ReadyBucket> readyBuckets(const ir::Phase &phase, const ProfiledPhase &profile);

} // namespace ganc::perf
