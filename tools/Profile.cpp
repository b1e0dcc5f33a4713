// Reading `ganc train --profile` files.
#include "tools/Profile.h"

#include "ir/Files.h"

#include <nlohmann/json.hpp>

namespace ganc::tools {

namespace {

Expected<ProfiledPhase> readPhase(const nlohmann::json &p, const std::string &path,
                                  const ir::Module &plan, ProfileOf match) {
  ProfiledPhase phase;
  phase.key = p.at("key").get<std::string>();
  phase.runs = p.at("runs").get<int64_t>();
  phase.compute = p.at("forward_backward_seconds").get<double>();
  phase.optimizer = p.at("optimizer_seconds").get<double>();
  for (const nlohmann::json &b : p.at("buckets"))
    phase.buckets.push_back({b.at("bytes").get<int64_t>(), b.at("ready_seconds").get<double>()});
  for (const nlohmann::json &parameter : p.at("parameters"))
    phase.parameterReady[parameter.at("name").get<std::string>()] =
        parameter.at("ready_seconds").get<double>();
  if (match == ProfileOf::Model)
    return phase;
  const ir::Phase *planned = plan.findPhase(phase.key);
  if (!planned || planned->buckets.size() != phase.buckets.size())
    return Status::error(path + " is a profile of another plan (phase '" + phase.key +
                         "' and its buckets are not this plan's)");
  for (size_t b = 0; b < phase.buckets.size(); ++b)
    if (phase.buckets[b].bytes != planned->buckets[b].bytes)
      return Status::error(path + " is a profile of another plan (phase '" + phase.key +
                           "', bucket " + std::to_string(b) + " has other bytes)");
  return phase;
}

} // namespace

Expected<Profile> readProfile(const std::string &path, const ir::Module &plan, ProfileOf match) {
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
      return Status::error(path + " is a profile of another " +
                           (match == ProfileOf::Plan ? "plan" : "model") + " (model " + identity +
                           ", this plan's is " + plan.identity + ")");
    Profile profile;
    profile.device = j.at("device").get<std::string>();
    profile.worldSize = j.at("world_size").get<int64_t>();
    profile.threads = j.at("threads").get<int64_t>();
    profile.steps = std::max<int64_t>(1, j.at("steps").get<int64_t>());
    for (const nlohmann::json &p : j.at("phases")) {
      auto phase = readPhase(p, path, plan, match);
      if (!phase)
        return phase.status();
      profile.phases.push_back(phase.take());
    }
    if (profile.phases.empty())
      return Status::error(path + " holds no profiled phase (did its run take steps after the "
                                  "warm-up and capture?)");
    return profile;
  } catch (const nlohmann::json::exception &e) {
    return Status::error(path + " is not a complete ganc profile (" + std::string(e.what()) + ")");
  }
}

} // namespace ganc::tools
