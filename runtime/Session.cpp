// The session's own questions: images per step, how a phase meets non-finite values, the
// optimizer state it holds.
#include "runtime/Session.h"

#include <algorithm>

namespace ganc::runtime {

int64_t Session::stepImages() const {
  int64_t micro = 1;
  for (const frontend::PhaseSpec &phase : spec().phases)
    if (std::any_of(phase.inputs.begin(), phase.inputs.end(),
                    [](const frontend::InputSpec &in) { return in.readsData(); }))
      micro = std::max(micro, recipe(phase).accumulate);
  return spec().batchSize * rank.worldSize * micro;
}

bool Session::skipsNonFinite(const std::string &phaseName) const {
  if (options.nonFinite == "skip")
    return true;
  for (const auto &phase : plan->phases)
    if (phase->name == phaseName)
      return !phase->lossScaler.empty();
  return false;
}

int64_t Session::optimizerStateBytes() const {
  int64_t bytes = 0;
  for (const auto &[name, optimizer] : optimizers)
    bytes += optimizer.stateBytes();
  return bytes;
}

} // namespace ganc::runtime
