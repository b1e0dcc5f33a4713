// comm-schedule: when each bucket is all-reduced, in one order that every rank follows.
//
// A bucket can be reduced as soon as the last of its gradients (in ready order) is complete.
// Buckets are launched in the order they become complete; collectives must be issued in the
// same order on every rank, so the runtime launches bucket k+1 only after bucket k even if
// k+1 completes first. Ties cannot occur: each parameter is in exactly one bucket.
//
// Invariant left: phase.schedule names every bucket exactly once, each after its own last
// parameter in ready order.
#include "passes/Pass.h"

#include <algorithm>
#include <map>

namespace ganc::passes {

Expected<bool> runCommSchedule(ir::Module &module, const PassOptions &) {
  bool changed = false;
  for (auto &phase : module.phases) {
    std::map<std::string, size_t> position;
    for (size_t i = 0; i < phase->readyOrder.size(); ++i)
      position[phase->readyOrder[i]] = i;
    std::vector<std::pair<size_t, ir::ScheduledAllReduce>> ready;
    for (size_t b = 0; b < phase->buckets.size(); ++b) {
      const ir::Bucket &bucket = phase->buckets[b];
      size_t last = 0;
      std::string lastName;
      for (const ir::Bucket::Slot &slot : bucket.slots) {
        auto it = position.find(slot.parameter);
        if (it == position.end())
          return Status::error("phase @" + phase->name + ": bucket #" + std::to_string(b) +
                               " holds @" + slot.parameter + ", which has no ready position");
        if (lastName.empty() || it->second >= last) {
          last = it->second;
          lastName = slot.parameter;
        }
      }
      ready.push_back({last, ir::ScheduledAllReduce{static_cast<int>(b), lastName}});
    }
    std::sort(ready.begin(), ready.end(),
              [](const auto &a, const auto &b) { return a.first < b.first; });
    std::vector<ir::ScheduledAllReduce> schedule;
    for (auto &entry : ready)
      schedule.push_back(entry.second);
    changed |= schedule.size() != phase->schedule.size();
    phase->schedule = std::move(schedule);
  }
  return changed;
}

} // namespace ganc::passes
