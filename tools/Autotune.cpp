// Bucket-cap autotuning against the communication model.
#include "tools/Autotune.h"

#include "ir/Files.h"
#include "tools/CommModel.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <map>

namespace ganc::tools {

namespace {

struct PhaseProfile {
  double compute = 0;
  std::map<std::string, double> ready; // by parameter
};

Expected<std::map<std::string, PhaseProfile>> readReadyTimes(const std::string &path,
                                                             const ir::Module &plan) {
  auto text = readFile(path);
  if (!text)
    return text.status().withContext("--profile");
  try {
    const nlohmann::json j = nlohmann::json::parse(*text);
    if (!j.is_object() || j.value("format", "") != "ganc-profile")
      return Status::error(path + " is not a ganc profile (write one with ganc train --profile)");
    if (j.at("identity").get<std::string>() != plan.identity)
      return Status::error(path + " is a profile of another model (" +
                           j.at("identity").get<std::string>() + ", this one is " + plan.identity +
                           ")");
    std::map<std::string, PhaseProfile> phases;
    for (const nlohmann::json &p : j.at("phases")) {
      PhaseProfile phase;
      phase.compute = p.at("forward_backward_seconds").get<double>();
      for (const nlohmann::json &parameter : p.at("parameters"))
        phase.ready[parameter.at("name").get<std::string>()] =
            parameter.at("ready_seconds").get<double>();
      phases[p.at("key").get<std::string>()] = std::move(phase);
    }
    return phases;
  } catch (const std::exception &e) {
    return Status::error(path + " is not a complete ganc profile (" + std::string(e.what()) + ")");
  }
}

/// The communication `phase`'s buckets leave exposed after backward, by the model.
double exposedSeconds(const ir::Phase &phase, const PhaseProfile &profile, int64_t ranks,
                      const Link &link) {
  std::vector<ReadyBucket> buckets;
  for (const ir::Bucket &bucket : phase.buckets) {
    ReadyBucket b{bucket.bytes, 0};
    for (const ir::Bucket::Slot &slot : bucket.slots) {
      auto ready = profile.ready.find(slot.parameter);
      b.ready = std::max(b.ready, ready == profile.ready.end() ? profile.compute : ready->second);
    }
    buckets.push_back(b);
  }
  // Launched in the order they complete (the comm-schedule pass's order).
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const ReadyBucket &a, const ReadyBucket &b) { return a.ready < b.ready; });
  return std::max(0.0, lastReduceEnd(buckets, ranks, link) - profile.compute);
}

} // namespace

Status autotuneBuckets(ir::Module &plan, const AutotuneOptions &options,
                       const passes::PipelineOptions &pipeline) {
  auto profiles = readReadyTimes(options.profile, plan);
  if (!profiles)
    return profiles.status();
  const Link link =
      links().at(options.ranks <= options.ranksPerHost ? options.intraLink : options.link);
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
    double ddp = 0;
  };
  std::map<std::string, Best> best;
  for (auto &phase : plan.phases) {
    phase->bucketCapBytes = phase->firstBucketCapBytes = 0;
    phase->schedule.clear(); // planned again for the buckets chosen
  }
  candidates.insert(candidates.begin(), ddp); // first, so that ties keep DDP's caps
  for (const auto &caps : candidates) {
    passes::PassOptions o = pipeline.pass;
    o.firstBucketCapBytes = caps.first;
    o.bucketCapBytes = caps.second;
    auto bucketed = passes::runBucketing(plan, o);
    if (!bucketed)
      return bucketed.status();
    for (const auto &phase : plan.phases) {
      auto profile = profiles->find(phase->key());
      if (profile == profiles->end())
        continue;
      const double exposed = exposedSeconds(*phase, profile->second, options.ranks, link);
      Best &b = best[phase->key()];
      if (caps == ddp)
        b.ddp = exposed;
      if (exposed < b.exposed) {
        b.exposed = exposed;
        b.caps = caps;
      }
    }
  }
  if (best.empty())
    return Status::error(options.profile + " profiles none of this plan's phases");
  for (auto &phase : plan.phases) {
    auto b = best.find(phase->key());
    if (b == best.end())
      continue;
    phase->firstBucketCapBytes = b->second.caps.first;
    phase->bucketCapBytes = b->second.caps.second;
    phase->tunedRanks = options.ranks;
    phase->tunedExposedSeconds = b->second.exposed;
    phase->defaultExposedSeconds = b->second.ddp;
  }
  // The module keeps the command line's caps (what a phase without a profile uses).
  return passes::runPipeline(plan, {"bucketing", "sharding", "comm-schedule"}, pipeline);
}

} // namespace ganc::tools
