// joint-schedule: each bucket's all-reduce placed in the phase's joint graph, right after the
// op that completes the last of its gradients.
//
// A gradient is complete once no later op reads or writes it or any tensor that shares its
// storage: a view of it, an in-place op on it (an ATen op's `view_of` names the operand its
// result is). Each bucket's collective (`ganc.all_reduce`, `ganc.reduce_scatter` with ZeRO 2)
// goes after the last op touching any of its gradients; buckets complete at one op go in
// bucket order. The phase's schedule follows the graph: the order every rank launches in is
// the order the graph completes the buckets, which is the order autograd ran the backward.
//
// Invariant left: every bucket's collective appears once in the joint graph, after each of its
// gradients is complete, with its gradients as operands; phase.schedule in the same order.
#include "passes/Pass.h"

#include <algorithm>
#include <map>
#include <memory>

namespace ganc::passes {

namespace {

bool isCollective(const Op &op) {
  return op.name == ir::joint::kAllReduce || op.name == ir::joint::kReduceScatter;
}

/// Ops that name the graph's outputs: they end values' lives, they compute nothing.
bool isOutput(const Op &op) {
  return op.name == ir::joint::kLoss || op.name == ir::joint::kGradient ||
         op.name == ir::joint::kBufferOut || op.name == ir::joint::kStat;
}

/// For every value of the joint graph, the index of the last op that reads or writes its
/// storage (its alias root's).
std::map<const Value *, size_t> lastTouch(const Block &joint) {
  std::map<const Value *, const Value *> root;
  auto rootOf = [&](const Value *v) {
    auto found = root.find(v);
    return found == root.end() ? v : found->second;
  };
  std::map<const Value *, size_t> touched; // by alias root
  for (size_t i = 0; i < joint.ops.size(); ++i) {
    const Op &op = *joint.ops[i];
    if (isOutput(op) || isCollective(op))
      continue;
    if (const auto *view = op.attribute("view_of"); view && !op.results.empty()) {
      const int64_t k = std::get<int64_t>(*view);
      if (k >= 0 && k < static_cast<int64_t>(op.operands.size()))
        root[op.results[0]] = rootOf(op.operands[static_cast<size_t>(k)]);
    }
    for (const Value *v : op.operands)
      touched[rootOf(v)] = i;
    for (const Value *v : op.results)
      touched[rootOf(v)] = i;
  }
  std::map<const Value *, size_t> last;
  for (const auto &op : joint.ops)
    for (const Value *v : op->results)
      if (touched.count(rootOf(v)))
        last[v] = touched[rootOf(v)];
  return last;
}

Status schedulePhase(ir::Phase &phase, bool reduceScatter) {
  auto &ops = phase.joint.ops;
  ops.erase(std::remove_if(ops.begin(), ops.end(),
                           [](const std::unique_ptr<Op> &op) { return isCollective(*op); }),
            ops.end());
  std::map<std::string, Value *> gradientOf;
  for (const auto &op : ops)
    if (op->name == ir::joint::kGradient && op->operands.size() == 1)
      gradientOf[op->symbol] = op->operands[0];
  const std::map<const Value *, size_t> last = lastTouch(phase.joint);
  struct Placed {
    size_t after;
    int bucket;
    std::string lastParameter;
  };
  std::vector<Placed> placed;
  for (size_t b = 0; b < phase.buckets.size(); ++b) {
    Placed p{0, static_cast<int>(b), ""};
    for (const ir::Bucket::Slot &slot : phase.buckets[b].slots) {
      auto gradient = gradientOf.find(slot.parameter);
      if (gradient == gradientOf.end())
        return Status::error("bucket #" + std::to_string(b) + " holds @" + slot.parameter +
                             ", whose gradient the joint graph does not compute");
      auto at = last.find(gradient->second);
      const size_t after = at == last.end() ? 0 : at->second;
      if (p.lastParameter.empty() || after >= p.after)
        p = {after, p.bucket, slot.parameter};
    }
    placed.push_back(p);
  }
  std::stable_sort(placed.begin(), placed.end(),
                   [](const Placed &a, const Placed &b) { return a.after < b.after; });
  std::vector<std::unique_ptr<Op>> scheduled;
  size_t next = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    scheduled.push_back(std::move(ops[i]));
    for (; next < placed.size() && placed[next].after == i; ++next) {
      auto op = std::make_unique<Op>();
      op->name = reduceScatter ? ir::joint::kReduceScatter : ir::joint::kAllReduce;
      for (const ir::Bucket::Slot &slot : phase.buckets[placed[next].bucket].slots)
        op->operands.push_back(gradientOf.at(slot.parameter));
      op->attributes.emplace_back("bucket", int64_t{placed[next].bucket});
      scheduled.push_back(std::move(op));
    }
  }
  ops = std::move(scheduled);
  phase.schedule.clear();
  for (const Placed &p : placed)
    phase.schedule.push_back({p.bucket, p.lastParameter});
  return Status::ok();
}

} // namespace

Expected<bool> runJointSchedule(ir::Module &module, const PassOptions &) {
  bool changed = false;
  for (auto &phase : module.phases) {
    if (phase->joint.ops.empty() || phase->buckets.empty())
      continue;
    GANC_TRY(schedulePhase(*phase, module.zeroStage == 2).inPhase(phase->key()));
    changed = true;
  }
  return changed;
}

} // namespace ganc::passes
