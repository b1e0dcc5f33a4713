// Reading `ganc train --profile` files.
#include "tools/Profile.h"

#include "ir/Files.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace ganc::tools {

namespace {

ProfiledPhase readPhase(const nlohmann::json &p) {
  ProfiledPhase phase;
  phase.key = p.at("key").get<std::string>();
  phase.runs = p.at("runs").get<int64_t>();
  phase.compute = p.at("forward_backward_seconds").get<double>();
  phase.optimizer = p.at("optimizer_seconds").get<double>();
  phase.reduced = p.value("all_reduced_seconds", -1.0);
  for (const nlohmann::json &parameter : p.at("parameters"))
    phase.parameterReady[parameter.at("name").get<std::string>()] =
        parameter.at("ready_seconds").get<double>();
  return phase;
}

} // namespace

Expected<Profile> readProfile(const std::string &path, const ir::Module &plan) {
  auto text = readFile(path);
  if (!text)
    return text.status().withContext("--profile");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*text);
  } catch (const std::exception &e) {
    return Status::error(path + " is not JSON (" + std::string(e.what()) + ")");
  }
  try {
    if (!j.is_object() || j.value("format", "") != "ganc-profile")
      return Status::error(path + " is not a ganc profile (write one with ganc train --profile)");
    const std::string identity = j.at("identity").get<std::string>();
    if (identity != plan.identity)
      return Status::error(path + " is a profile of another model (" + identity +
                           "; this plan's is " + plan.identity + ")");
    Profile profile;
    profile.device = j.at("device").get<std::string>();
    profile.worldSize = j.at("world_size").get<int64_t>();
    profile.threads = j.at("threads").get<int64_t>();
    profile.steps = std::max<int64_t>(1, j.at("steps").get<int64_t>());
    profile.zero = j.value("zero", 0);
    if (profile.zero)
      return Status::error(path + " was measured sharded (zero " + std::to_string(profile.zero) +
                           " at " + std::to_string(profile.worldSize) +
                           " ranks): its optimizer time is one shard's; profile unsharded (one "
                           "rank runs unsharded)");
    for (const nlohmann::json &p : j.at("phases"))
      profile.phases.push_back(readPhase(p));
    if (profile.phases.empty())
      return Status::error(path + " holds no profiled phase (did its run take steps after the "
                                  "warm-up and capture?)");
    return profile;
  } catch (const nlohmann::json::exception &e) {
    return Status::error(path + " is not a complete ganc profile (" + std::string(e.what()) + ")");
  }
}

std::vector<ReadyBucket> readyBuckets(const ir::Phase &phase, const ProfiledPhase &profile) {
  std::vector<ReadyBucket> buckets;
  for (const ir::Bucket &bucket : phase.buckets) {
    ReadyBucket b{bucket.bytes, 0};
    for (const ir::Bucket::Slot &slot : bucket.slots) {
      auto ready = profile.parameterReady.find(slot.parameter);
      b.ready = std::max(b.ready,
                         ready == profile.parameterReady.end() ? profile.compute : ready->second);
    }
    buckets.push_back(b);
  }
  if (phase.schedule.size() == phase.buckets.size()) {
    std::vector<ReadyBucket> scheduled;
    for (const ir::ScheduledAllReduce &s : phase.schedule)
      scheduled.push_back(buckets.at(static_cast<size_t>(s.bucket)));
    return scheduled;
  }
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const ReadyBucket &a, const ReadyBucket &b) { return a.ready < b.ready; });
  return buckets;
}

} // namespace ganc::tools
