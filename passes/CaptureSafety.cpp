// capture-safety: can a phase be captured once into a CUDA Graph and replayed?
//
// A graph replays a fixed sequence of kernels on fixed buffers. It breaks on ops that copy a
// device value to the host (the CPU must wait, and the captured branch would be frozen) and
// on ops whose output shape depends on data (the buffer sizes are fixed at capture). The pass
// scans every op of the phase, nested regions included, and records the first such op as the
// reason the phase runs eagerly.
//
// Invariant left: phase.hasCaptureFacts; phase.eagerReason empty iff capture is safe.
#include "passes/Pass.h"

#include <map>

namespace ganc::passes {

namespace {

const char *unsafeReason(const std::string &op) {
  static const std::map<std::string, const char *> reasons = {
      {"aten::item", "copies a tensor value to the host"},
      {"aten::_local_scalar_dense", "copies a tensor value to the host"},
      {"aten::tolist", "copies a tensor to the host"},
      {"aten::Bool", "branches on a tensor value (host sync)"},
      {"aten::Int", "reads a tensor value on the host"},
      {"aten::Float", "reads a tensor value on the host"},
      {"aten::ScalarImplicit", "reads a tensor value on the host"},
      {"aten::is_nonzero", "branches on a tensor value (host sync)"},
      {"aten::equal", "compares tensors on the host"},
      {"aten::allclose", "compares tensors on the host"},
      {"aten::cpu", "copies a tensor to the host"},
      {"prim::Print", "prints a tensor (host sync)"},
      {"aten::nonzero", "has a data-dependent output shape"},
      {"aten::nonzero_numpy", "has a data-dependent output shape"},
      {"aten::masked_select", "has a data-dependent output shape"},
      {"aten::unique", "has a data-dependent output shape"},
      {"aten::_unique2", "has a data-dependent output shape"},
      {"aten::unique_consecutive", "has a data-dependent output shape"},
      {"aten::unique_dim", "has a data-dependent output shape"},
      {"aten::bincount", "has a data-dependent output shape"},
      {"aten::repeat_interleave", "may have a data-dependent output shape"},
      {"aten::multinomial", "synchronises with the host"},
  };
  auto it = reasons.find(op);
  return it == reasons.end() ? nullptr : it->second;
}

} // namespace

Expected<bool> runCaptureSafety(ir::Module &module, const PassOptions &) {
  bool changed = false;
  for (auto &phase : module.phases) {
    std::string reason;
    phase->walk([&](const Op &op) {
      if (!reason.empty())
        return;
      if (const char *why = unsafeReason(op.name))
        reason = op.name +
                 (op.results.empty() ? std::string() : " (%" + op.results[0]->name + ")") + " " +
                 why;
    });
    changed |= !phase->hasCaptureFacts || reason != phase->eagerReason;
    phase->eagerReason = reason;
    phase->hasCaptureFacts = true;
  }
  return changed;
}

} // namespace ganc::passes
