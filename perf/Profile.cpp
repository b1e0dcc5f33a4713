// Reading `ganc train --profile` files.
#include "perf/Profile.h"

#include "support/Files.h"
#include "support/Json.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

namespace ganc::perf {

namespace {

/// The profile format this ganc writes and reads.
constexpr int kProfileVersion = 1;

/// A time in seconds from the phase's start, not negative (a hand-edited or damaged file
/// would otherwise predict negative steps; JSON holds no infinity or NaN).
Status readSeconds(const nlohmann::json &object, const char *field, const std::string &where,
                   double &out) {
  out = object.at(field).get<double>();
  if (!std::isfinite(out) || out < 0)
    return Status::error(where + ": " + field + " is " + object.at(field).dump() +
                         "; it must be a time in seconds (not negative)");
  return Status::ok();
}

/// A count that must be at least `least`.
Status readCount(const nlohmann::json &object, const char *field, int64_t least,
                 const std::string &where, int64_t &out) {
  out = object.at(field).get<int64_t>();
  if (out < least)
    return Status::error(where + ": " + field + " is " + std::to_string(out) +
                         "; it must be at least " + std::to_string(least));
  return Status::ok();
}

Status readPhase(const nlohmann::json &p, const ir::Module &plan, const std::string &path,
                 ProfiledPhase &phase) {
  phase.key = p.at("key").get<std::string>();
  const std::string where = path + ": phase '" + phase.key + "'";
  const ir::Phase *planned = plan.findPhase(phase.key);
  if (!planned)
    return Status::error(path + " profiles phase '" + phase.key +
                         "', which this plan does not have");
  int64_t timed = 0;
  GANC_TRY(readCount(p, "runs", 1, where, phase.runs));
  GANC_TRY(readCount(p, "timed_runs", 1, where, timed));
  if (timed > phase.runs)
    return Status::error(where + ": timed_runs (" + std::to_string(timed) +
                         ") is more than its runs (" + std::to_string(phase.runs) + ")");
  GANC_TRY(readSeconds(p, "forward_backward_seconds", where, phase.compute));
  GANC_TRY(readSeconds(p, "optimizer_seconds", where, phase.optimizer));
  if (p.contains("all_reduced_seconds"))
    GANC_TRY(readSeconds(p, "all_reduced_seconds", where, phase.reduced));
  // Every used parameter of the plan's phase, once: the ready times are what the simulator
  // and the autotuner bucket (the model's identity fixes which parameters a phase trains).
  const std::set<std::string> used(planned->used.begin(), planned->used.end());
  for (const nlohmann::json &parameter : p.at("parameters")) {
    const std::string name = parameter.at("name").get<std::string>();
    if (!used.count(name))
      return Status::error(where + " times parameter '" + name +
                           "', which this plan's phase does not train");
    double ready = 0;
    GANC_TRY(readSeconds(parameter, "ready_seconds", where + ", parameter '" + name + "'", ready));
    if (!phase.parameterReady.emplace(name, ready).second)
      return Status::error(where + " times parameter '" + name + "' twice");
  }
  for (const std::string &name : planned->used)
    if (!phase.parameterReady.count(name))
      return Status::error(where + " has no ready time for parameter '" + name +
                           "', which the phase trains");
  return Status::ok();
}

} // namespace

Expected<Profile> readProfile(const std::string &path, const ir::Module &plan) {
  auto text = readFile(path);
  if (!text)
    return text.status().withContext("--profile");
  auto parsed = parseJson(std::string(text->begin(), text->end()), path);
  if (!parsed)
    return parsed.status();
  nlohmann::json j = parsed.take();
  try {
    if (!j.is_object() || j.value("format", "") != "ganc-profile")
      return Status::error(path + " is not a ganc profile (write one with ganc train --profile)");
    if (j.at("version") != kProfileVersion)
      return Status::error(path + " is a ganc profile of version " + j.at("version").dump() +
                           "; this ganc reads version " + std::to_string(kProfileVersion) +
                           " (profile again with this ganc's train --profile)");
    const std::string identity = j.at("identity").get<std::string>();
    if (identity != plan.identity)
      return Status::error(path + " is a profile of another model (" + identity +
                           "; this plan's is " + plan.identity + ")");
    Profile profile;
    profile.device = j.at("device").get<std::string>();
    if (profile.device != "cpu" && profile.device != "cuda")
      return Status::error(path + ": device is '" + profile.device + "'; it must be cpu or cuda");
    GANC_TRY(readCount(j, "world_size", 1, path, profile.worldSize));
    GANC_TRY(readCount(j, "threads", 1, path, profile.threads));
    GANC_TRY(readCount(j, "steps", 1, path, profile.steps));
    profile.zero = j.value("zero", 0);
    if (profile.zero < 0 || profile.zero > 2)
      return Status::error(path + ": zero is " + std::to_string(profile.zero) +
                           "; ZeRO stages are 0, 1 and 2");
    if (profile.zero)
      return Status::error(path + " was measured sharded (zero " + std::to_string(profile.zero) +
                           " at " + std::to_string(profile.worldSize) +
                           " ranks): its optimizer time is one shard's; profile unsharded (one "
                           "rank runs unsharded)");
    const nlohmann::json &phases = j.at("phases");
    if (!phases.is_array())
      return Status::error(path + ": phases must be a list");
    std::set<std::string> keys;
    for (const nlohmann::json &p : phases) {
      ProfiledPhase phase;
      GANC_TRY(readPhase(p, plan, path, phase));
      if (!keys.insert(phase.key).second)
        return Status::error(path + " profiles phase '" + phase.key + "' twice");
      profile.phases.push_back(std::move(phase));
    }
    if (profile.phases.empty())
      return Status::error(path + " holds no profiled phase (did its run take steps after the "
                                  "warm-up and capture?)");
    return profile;
  } catch (const nlohmann::json::exception &e) {
    return Status::error(path + " is not a complete ganc profile (" + std::string(e.what()) + ")");
  }
}

std::string untimedPhases(const ir::Module &plan, const Profile &profile, const std::string &path) {
  std::string untimed;
  for (const auto &phase : plan.phases)
    if (std::none_of(profile.phases.begin(), profile.phases.end(),
                     [&](const ProfiledPhase &p) { return p.key == phase->key(); }))
      untimed += (untimed.empty() ? "'" : ", '") + phase->key() + "'";
  if (untimed.empty())
    return "";
  return path + " has no timings for phase " + untimed +
         " (no run after the warm-up; profile more steps)";
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

} // namespace ganc::perf
