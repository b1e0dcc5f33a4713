// ready-order: the order in which backward completes the gradients of the used parameters.
//
// Algorithm. Backward runs the ops of the forward in reverse. A parameter's gradient is
// complete once the backward of its *first* use in the forward has run (later uses are
// differentiated earlier). Number the ops of the phase in program order (nested regions
// included), find for every used parameter the first op that consumes it, and sort by that
// op's number, latest first. Parameters first used by the same op form one group, kept
// together and in operand order: the order of a weight and its bias inside one op's backward
// is not fixed, so nothing downstream may depend on it.
//
// Invariant left: phase.readyOrder is a permutation of phase.used.
#include "passes/FirstUse.h"
#include "passes/Pass.h"

#include <algorithm>
#include <map>
#include <vector>

namespace ganc::passes {

namespace {

/// The order in which a joint graph completes its gradients: by the op making each one.
std::vector<std::string> jointReadyOrder(const ir::Phase &phase) {
  std::map<const Value *, size_t> indexOf;
  for (size_t i = 0; i < phase.joint.ops.size(); ++i)
    for (const Value *result : phase.joint.ops[i]->results)
      indexOf[result] = i;
  std::map<std::string, size_t> madeAt;
  for (const auto &op : phase.joint.ops)
    if (op->name == ir::joint::kGradient && !op->operands.empty()) {
      auto it = indexOf.find(op->operands[0]);
      madeAt[op->symbol] = it == indexOf.end() ? 0 : it->second;
    }
  std::vector<std::string> order = phase.used;
  std::stable_sort(order.begin(), order.end(), [&](const std::string &a, const std::string &b) {
    return madeAt[a] < madeAt[b];
  });
  return order;
}

} // namespace

std::map<std::string, FirstUse> firstUses(const ir::Phase &phase) {
  std::map<const Value *, std::string> paramOf;
  phase.walk([&](const Op &op) {
    if (op.name == "ganc.param" && !op.results.empty())
      paramOf[op.results[0]] = op.symbol;
  });
  std::map<std::string, FirstUse> first;
  int64_t index = 0;
  phase.walk([&](const Op &op) {
    for (size_t i = 0; i < op.operands.size(); ++i) {
      auto it = paramOf.find(op.operands[i]);
      if (it == paramOf.end())
        continue;
      FirstUse &f = first[it->second];
      if (index < f.opIndex)
        f = FirstUse{index, i};
    }
    ++index;
  });
  return first;
}

Expected<bool> runReadyOrder(ir::Module &module, const PassOptions &) {
  bool changed = false;
  for (auto &phase : module.phases) {
    if (!phase->hasUsedFacts)
      return Status::error("phase @" + phase->name + ": ready-order needs used-params first");
    if (phase->onlyJoint()) {
      std::vector<std::string> order = jointReadyOrder(*phase);
      changed |= order != phase->readyOrder;
      phase->readyOrder = std::move(order);
      continue;
    }
    std::map<std::string, FirstUse> first = firstUses(*phase);
    std::vector<std::string> order = phase->used;
    // stable_sort keeps declaration order for parameters that reach the loss without any
    // consuming op (they sort last: ready at the very end of backward).
    std::stable_sort(order.begin(), order.end(), [&](const std::string &a, const std::string &b) {
      const FirstUse &fa = first[a], &fb = first[b];
      if (fa.opIndex != fb.opIndex)
        return fa.opIndex == FirstUse::kNever
                   ? false
                   : (fb.opIndex == FirstUse::kNever || fa.opIndex > fb.opIndex);
      return fa.operandIndex < fb.operandIndex;
    });
    changed |= order != phase->readyOrder;
    phase->readyOrder = std::move(order);
  }
  return changed;
}

} // namespace ganc::passes
