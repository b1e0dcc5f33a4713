// capture-safety: can a phase be captured once into a CUDA Graph and replayed?
//
// A graph replays a fixed sequence of kernels on fixed buffers. It breaks on ops that copy a
// device value to the host (the CPU must wait, and the captured branch would be frozen) and
// on ops whose output shape depends on data (the buffer sizes are fixed at capture). The pass
// scans every op of the phase, nested regions included, and records the first such op as the
// reason the phase runs eagerly.
//
// Invariant left: phase.hasCaptureFacts; phase.eagerReason empty iff capture is safe.
#include "passes/OpTraits.h"
#include "passes/Pass.h"

namespace ganc::passes {

Expected<bool> runCaptureSafety(ir::Module &module, const PassOptions &) {
  bool changed = false;
  for (auto &phase : module.phases) {
    std::string reason;
    phase->walk([&](const Op &op) {
      if (!reason.empty())
        return;
      if (const char *why = captureUnsafeReason(op.name))
        reason = op.name +
                 (op.results.empty() ? std::string() : " (%" + op.results[0]->name + ")") + " " +
                 why;
    });
    // Which conditional parameters a step reached is read on the host after backward.
    if (reason.empty() && !phase->conditional.empty())
      reason = "@" + phase->conditional.front() +
               " is reached only under a branch on data (checked on the host each step)";
    changed |= !phase->hasCaptureFacts || reason != phase->eagerReason;
    phase->eagerReason = reason;
    phase->hasCaptureFacts = true;
  }
  return changed;
}

} // namespace ganc::passes
