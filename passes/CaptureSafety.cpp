// capture-safety: can a phase be captured once into a CUDA Graph and replayed?
//
// A graph replays a fixed sequence of kernels on fixed buffers. It breaks on ops that copy a
// device value to the host (the CPU must wait, and the captured branch would be frozen) and
// on ops whose output shape depends on data (the buffer sizes are fixed at capture). The pass
// scans every op of the phase, nested regions included, and records the first such op as the
// reason the phase runs eagerly. A phase that shares values with others of its step (an
// `output` input, a section it runs `through`, values it hands on) is captured as safely as any
// other: the runtime captures such a step's phases and sections together, as one graph, so
// the values and what a later backward needs of them stay inside it (see
// backend/cuda/CudaGraphExecutor.cpp). A section that no phase takes through its graph is
// not lowered, so not scanned here; its capture fails at run time with the op's error.
//
// One exception: a traced network's shape arithmetic. The tracer records `x.shape[0]` as
// aten::size -> prim::NumToTensor (a tensor on the host, made from a host int), does its
// arithmetic on such tensors and reads them back with aten::Int. Those reads touch no device
// value, so aten::Int / aten::Float / aten::ScalarImplicit of a *host scalar* — a value built
// only from non-tensor values, NumToTensor, 0-dim constants and arithmetic or casts on host scalars
// (a cast may name the host, "cpu", never another device) — do not stop capture.
//
// Invariant left: phase.hasCaptureFacts; phase.eagerReason empty iff capture is safe.
#include "passes/OpTraits.h"
#include "passes/Pass.h"

#include <set>
#include <string>
#include <unordered_map>

namespace ganc::passes {

namespace {

/// Ops whose result is a host scalar when every operand is one (and none is a device).
bool keepsHostScalar(const std::string &name) {
  static const std::set<std::string> ops = {
      "prim::NumToTensor", "aten::to",       "aten::mul",          "aten::add",
      "aten::sub",         "aten::div",      "aten::floor_divide", "aten::remainder",
      "aten::neg",         "aten::floordiv", "aten::detach",       "aten::min",
      "aten::max",         "aten::minimum",  "aten::maximum",      "aten::clone"};
  return ops.count(name) != 0;
}

/// Whether `value` is a host scalar (see the file comment); memoised per phase.
bool isHostScalar(const Value *value, std::unordered_map<const Value *, bool> &memo) {
  if (!value->type.isTensor()) {
    if (value->type.name != "device")
      return true;
    // The tracer's casts name the host: `aten::to(%n, cpu, i64, ...)`.
    const Op *op = value->definingOp;
    const ir::Attribute *device = op != nullptr ? op->attribute("value") : nullptr;
    return device != nullptr && std::holds_alternative<std::string>(*device) &&
           std::get<std::string>(*device) == "cpu";
  }
  auto found = memo.find(value);
  if (found != memo.end())
    return found->second;
  memo[value] = false; // no cycles in SSA, but be safe
  const Op *op = value->definingOp;
  // The tracer also bakes Python numbers it met as tensors into 0-dim constants (`fw + 3`),
  // which live on the host where the archive was exported.
  bool host = op != nullptr &&
              (keepsHostScalar(op->name) ||
               (op->name == "prim::Constant" && value->type.hasShape && value->type.shape.empty()));
  for (size_t i = 0; host && i < op->operands.size(); ++i)
    host = isHostScalar(op->operands[i], memo);
  memo[value] = host;
  return host;
}

bool readsHostScalar(const Op &op, std::unordered_map<const Value *, bool> &memo) {
  return (op.name == "aten::Int" || op.name == "aten::Float" ||
          op.name == "aten::ScalarImplicit") &&
         op.operands.size() == 1 && isHostScalar(op.operands[0], memo);
}

} // namespace

Expected<bool> runCaptureSafety(ir::Module &module, const PassOptions &) {
  bool changed = false;
  for (auto &phase : module.phases) {
    std::string reason;
    if (phase->onlyJoint()) // its joint graph runs through ganc's executor, on the CPU for now
      reason = "its joint graph is not captured as a CUDA Graph yet";
    std::unordered_map<const Value *, bool> hostScalars;
    phase->walk([&](const Op &op) {
      if (!reason.empty() || readsHostScalar(op, hostScalars))
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
