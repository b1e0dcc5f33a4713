// The log interval a checkpoint cuts: written with the checkpoint, restored by the resume.
#include "runtime/rundir/Progress.h"

namespace ganc::runtime {

Status Progress::beforeCheckpoint(int64_t done) {
  const TrainOptions &o = session_.options;
  session_.logInterval.clear();
  if (done % o.logEvery == 0 || done == o.steps)
    return Status::ok(); // the log line has just counted the interval
  GANC_TRY(drainPending());
  auto moments = reduceInterval(done, statsInterval_);
  if (!moments)
    return moments.status();
  if (!session_.isRankZero())
    return Status::ok();
  // In reduceInterval's order: the spec's phases, then the logged values by phase and name.
  nlohmann::json losses = nlohmann::json::object(), stats = nlohmann::json::array();
  size_t k = 0;
  for (const frontend::PhaseSpec &phase : session_.spec().phases) {
    losses[phase.name] = {(*moments)[k], (*moments)[k + 1], (*moments)[k + 2]};
    k += 3;
  }
  for (const auto &[phase, values] : statsInterval_)
    for (const auto &[name, m] : values) {
      stats.push_back({phase, name, (*moments)[k], (*moments)[k + 1], (*moments)[k + 2]});
      k += 3;
    }
  session_.logInterval = nlohmann::json{{"losses", losses}, {"stats", stats}}.dump();
  return Status::ok();
}

void Progress::restoreInterval(const std::string &text) {
  const nlohmann::json saved = nlohmann::json::parse(text, nullptr, false);
  const bool counted = session_.isRankZero();
  auto moments = [&](const nlohmann::json &v, size_t at) {
    Moments m;
    if (counted && v.is_array() && v.size() >= at + 3 && v[at].is_number() &&
        v[at + 1].is_number() && v[at + 2].is_number())
      m = {v[at].get<double>(), v[at + 1].get<double>(), v[at + 2].get<double>()};
    return m;
  };
  if (saved.contains("losses") && saved["losses"].is_object())
    for (const auto &[phase, v] : saved["losses"].items())
      interval_[phase] = moments(v, 0);
  if (saved.contains("stats") && saved["stats"].is_array())
    for (const nlohmann::json &v : saved["stats"])
      if (v.is_array() && v.size() == 5 && v[0].is_string() && v[1].is_string())
        statsInterval_[v[0].get<std::string>()][v[1].get<std::string>()] = moments(v, 2);
}

} // namespace ganc::runtime
