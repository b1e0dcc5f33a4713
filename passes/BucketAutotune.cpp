// Bucket-cap autotuning: a pass over a compiled plan that takes a measured profile and the
// communication model (perf/), not in the default pipeline (it needs the profile).
//
// For each candidate pair of caps, every phase is bucketed again and its all-reduces timed by
// the model from the profiled gradient ready times; a phase keeps the caps with the least
// communication left exposed after backward, if that beats DDP's caps by kMinSaving of the
// phase's time. The passes from bucketing on then run again, so the plan it leaves is as
// verified as any other.
#include "passes/BucketAutotune.h"

#include "perf/CommModel.h"
#include "perf/Profile.h"

#include <algorithm>
#include <iostream>
#include <limits>
#include <map>

namespace ganc::passes {

using namespace ganc::perf;

namespace {

/// Other caps than DDP's only where the model predicts the phase at least this much faster
/// (a share of its time under DDP's caps). Runs across a shaped link between two hosts
/// (bench/multihost_scaling.py) measured smaller predicted savings as often slower as faster.
constexpr double kMinSaving = 0.02;

/// `phase` with its current buckets, by the model.
PhaseRun simulated(const ir::Phase &phase, const ProfiledPhase &profile, int64_t ranks,
                   const Link &link, int zeroStage) {
  return simulatePhase(readyBuckets(phase, profile), profile.compute, profile.optimizer, ranks,
                       link, zeroStage);
}

} // namespace

Status autotuneBuckets(ir::Module &plan, const AutotuneOptions &options,
                       const PipelineOptions &pipeline) {
  auto profile = readProfile(options.profile, plan);
  if (!profile)
    return profile.status();
  std::map<std::string, const ProfiledPhase *> profiles;
  for (const ProfiledPhase &phase : profile->phases)
    profiles[phase.key] = &phase;
  const Link link = options.topology.linkFor(options.ranks);
  constexpr int64_t kMiB = int64_t{1} << 20;
  std::vector<std::pair<int64_t, int64_t>> candidates; // (first, rest)
  for (int64_t cap : {kMiB / 4, kMiB / 2, kMiB, 2 * kMiB, 4 * kMiB, 8 * kMiB, 16 * kMiB, 25 * kMiB,
                      50 * kMiB, 100 * kMiB, std::numeric_limits<int64_t>::max() / 4}) {
    candidates.emplace_back(cap, cap);
    if (cap > kMiB)
      candidates.emplace_back(kMiB, cap);
  }
  const std::pair<int64_t, int64_t> ddp{kMiB, 25 * kMiB};
  struct Best {
    std::pair<int64_t, int64_t> caps;
    double exposed = std::numeric_limits<double>::infinity();
    PhaseRun ddp;
  };
  std::map<std::string, Best> best;
  for (auto &phase : plan.phases) {
    phase->bucketCapBytes = phase->firstBucketCapBytes = 0;
    phase->schedule.clear(); // planned again for the buckets chosen
  }
  candidates.insert(candidates.begin(), ddp); // first, so that ties keep DDP's caps
  for (const auto &caps : candidates) {
    PassOptions o = pipeline.pass;
    o.firstBucketCapBytes = caps.first;
    o.bucketCapBytes = caps.second;
    auto bucketed = runBucketing(plan, o);
    if (!bucketed)
      return bucketed.status();
    for (const auto &phase : plan.phases) {
      auto profiled = profiles.find(phase->key());
      if (profiled == profiles.end())
        continue;
      const PhaseRun run =
          simulated(*phase, *profiled->second, options.ranks, link, plan.zeroStage);
      const double exposed = run.exposed;
      Best &b = best[phase->key()];
      if (caps == ddp)
        b.ddp = run;
      if (exposed < b.exposed) {
        b.exposed = exposed;
        b.caps = caps;
      }
    }
  }
  if (best.empty())
    return Status::error(options.profile + " profiles none of this plan's phases");
  if (const std::string untimed = untimedPhases(plan, *profile, options.profile); !untimed.empty())
    std::cerr << "ganc: warning: compile: " << untimed << ": not autotuned, its buckets are "
              << "capped at " << static_cast<double>(pipeline.pass.bucketCapBytes) / kMiB
              << " MiB (the first at "
              << static_cast<double>(pipeline.pass.firstBucketCapBytes) / kMiB << " MiB)"
              << std::endl; // bucketed below with the command line's caps
  for (auto &phase : plan.phases) {
    auto b = best.find(phase->key());
    if (b == best.end())
      continue;
    if (b->second.ddp.exposed - b->second.exposed < kMinSaving * b->second.ddp.end) {
      b->second.caps = ddp;
      b->second.exposed = b->second.ddp.exposed;
    }
    phase->firstBucketCapBytes = b->second.caps.first;
    phase->bucketCapBytes = b->second.caps.second;
    phase->tunedRanks = options.ranks;
    phase->tunedExposedSeconds = b->second.exposed;
    phase->defaultExposedSeconds = b->second.ddp.exposed;
  }
  // The module keeps the command line's caps (what a phase without a profile uses).
  return runPipeline(plan, {"bucketing", "sharding", "comm-schedule", "joint-schedule"}, pipeline);
}

} // namespace ganc::passes
