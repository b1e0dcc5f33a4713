// used-params: which parameters of the updated submodules receive a gradient in each phase.
//
// Algorithm. Build a "may carry gradient from" relation over SSA values: an op's results
// depend on its operands, unless the op runs under no_grad, is non-differentiable (detach,
// *_like factories, size queries), or the value cannot hold a gradient (integer/bool tensors,
// scalars, objects). prim::If results depend on the values both branches yield; prim::Loop
// carried values depend on their initial value and on what the body yields, to a fixpoint.
// In-place ops that survived the frontend's mutation removal write into their first operand:
// every value aliasing that operand (through views or earlier in-place ops) then also depends
// on the op's other operands. Writes into a list or dict (append, extend, insert, item
// assignment, dict.update) are such writes too: an element read back (__getitem__, unpacking:
// views of the container) or a value computed from the container sees what was written. Parameters
// reachable backwards from the loss are used.
//
// torch.autograd.grad (aten::grad) inside a phase (gradient penalties: R1, WGAN-GP, path
// length) yields the gradient of `outputs` with respect to `inputs`. That gradient is computed
// by the backward formulas of the ops between them, and each reads only some operands for the
// operand the gradient flows through: through x of x * w it reads w, through x of linear the
// weight, never the bias; add reads nothing, activations read their input. So the result
// depends on exactly those operands (all operands for ops not in the table). This is what
// makes a discriminator's last bias unused in an R1 phase, and every to-RGB bias unused in
// StyleGAN2's path-length phase (img * noise reads only the noise), as in eager autograd.
//
// A used parameter whose every read sits inside a prim::If or prim::Loop region (a branch or a
// loop on a tensor value: which way it goes is data) is also listed as conditional: the
// runtime checks per step whether some rank reached it. A branch that raises never completes,
// so no gradient comes from it: a parameter read in every branch of a prim::If that does not
// raise is read whichever way it goes (a traced network's dispatch on its input shapes, whose
// last branch raises, reads every parameter in each of the others).
//
// Invariant left: phase.used lists, in declaration order, the reachable parameters the phase
// trains (within its `updates` paths); phase.unused the remaining ones it trains; neither
// holds a parameter the phase does not train; phase.conditional is a subset of phase.used.
#include "passes/OpTraits.h"
#include "passes/Pass.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

namespace ganc::passes {

namespace {

class Reachability {
public:
  void addEdge(const Value *to, const Value *from) {
    if (to->type.mayCarryGradient() && from->type.mayCarryGradient())
      deps_[to].insert(from);
  }

  void unite(const Value *a, const Value *b) { parent_[find(a)] = find(b); }

  const Value *find(const Value *v) {
    auto it = parent_.find(v);
    if (it == parent_.end() || it->second == v)
      return v;
    return parent_[v] = find(it->second);
  }

  void build(const Block &block) {
    for (const auto &op : block.ops) {
      for (const Block &region : op->regions)
        build(region);
      if (isView(op->name) || isInPlace(op->name) || writesContainer(op->name))
        for (const Value *r : op->results)
          if (!op->operands.empty())
            unite(r, op->operands[0]);
      // A container holds what it is given as it is, gradient history and all, even when the
      // write runs under no_grad.
      if (writesContainer(op->name))
        inPlace_.push_back(op.get());
      if (op->noGrad || isNonDifferentiable(op->name))
        continue;
      if (op->name == "prim::If") {
        for (const Block &region : op->regions)
          for (size_t i = 0; i < op->results.size() && i < region.yields.size(); ++i)
            addEdge(op->results[i], region.yields[i]);
        continue;
      }
      if (op->name == "prim::Loop" && op->regions.size() == 1) {
        // operands: trip count, initial condition, carried values...;
        // body arguments: iteration, carried values...; body yields: condition, carried...
        const Block &body = op->regions[0];
        for (size_t i = 0; i < op->results.size(); ++i) {
          const Value *initial = i + 2 < op->operands.size() ? op->operands[i + 2] : nullptr;
          const Value *next = i + 1 < body.yields.size() ? body.yields[i + 1] : nullptr;
          const Value *arg = i + 1 < body.arguments.size() ? body.arguments[i + 1] : nullptr;
          for (const Value *target : {static_cast<const Value *>(op->results[i]), arg}) {
            if (!target)
              continue;
            if (initial)
              addEdge(target, initial);
            if (next)
              addEdge(target, next);
          }
        }
        continue;
      }
      for (const Value *r : op->results) {
        for (const Value *operand : op->operands)
          addEdge(r, operand);
        for (const Block &region : op->regions)
          for (const Value *y : region.yields)
            addEdge(r, y);
      }
      if (isInPlace(op->name))
        inPlace_.push_back(op.get());
      if (op->name == "aten::grad" && op->operands.size() >= 2)
        gradOps_.push_back(op.get());
      for (const Value *r : op->results)
        definingOp_[r] = op.get();
    }
  }

  /// Replaces the generic "depends on every operand" edges of each aten::grad by what the
  /// backward formulas of the ops on the paths from its inputs to its outputs read, edge by
  /// edge: only the operands a gradient flows through select what is read.
  void refineGradOps() {
    for (const Op *grad : gradOps_) {
      std::set<const Value *> upstreamOfOutputs = closure(grad->operands[0]);
      std::set<const Value *> inputs = listElements(grad->operands[1]);
      std::set<const Value *> dependsOnInputs;
      for (const Value *v : upstreamOfOutputs)
        if (reachesAny(v, inputs))
          dependsOnInputs.insert(v);
      std::set<const Value *> saved;
      for (const Value *v : dependsOnInputs) {
        auto def = definingOp_.find(v);
        if (def == definingOp_.end())
          continue;
        const Op *op = def->second;
        for (size_t through = 0; through < op->operands.size(); ++through) {
          if (!dependsOnInputs.count(op->operands[through]))
            continue; // no gradient flows back through this operand
          std::vector<size_t> measured;
          const std::vector<size_t> *reads = backwardReads(*op, through, measured);
          for (size_t i = 0; i < op->operands.size(); ++i)
            if (!reads || std::find(reads->begin(), reads->end(), i) != reads->end())
              saved.insert(op->operands[i]);
        }
      }
      for (size_t i = 2; i < grad->operands.size(); ++i)
        saved.insert(grad->operands[i]); // grad_outputs
      for (const Value *r : grad->results) {
        deps_[r].clear();
        for (const Value *v : saved)
          addEdge(r, v);
      }
    }
  }

  /// Values from which a gradient can flow into `root`.
  std::set<const Value *> reach(const Value *root) {
    // Mutations: everything aliasing the written operand depends on the written values.
    std::map<const Value *, std::vector<const Value *>> classDeps;
    for (const Op *op : inPlace_)
      for (size_t i = 1; i < op->operands.size(); ++i)
        classDeps[find(op->operands[0])].push_back(op->operands[i]);
    std::set<const Value *> seen;
    std::vector<const Value *> work = {root};
    std::set<const Value *> classesDone;
    while (!work.empty()) {
      const Value *v = work.back();
      work.pop_back();
      if (!seen.insert(v).second)
        continue;
      for (const Value *d : deps_[v])
        work.push_back(d);
      const Value *cls = find(v);
      if (classesDone.insert(cls).second)
        for (const Value *d : classDeps[cls])
          if (d->type.mayCarryGradient())
            work.push_back(d);
    }
    return seen;
  }

private:
  /// Values `root` depends on, itself included.
  std::set<const Value *> closure(const Value *root) {
    std::set<const Value *> seen;
    std::vector<const Value *> work = {root};
    while (!work.empty()) {
      const Value *v = work.back();
      work.pop_back();
      if (seen.insert(v).second)
        for (const Value *d : deps_[v])
          work.push_back(d);
    }
    return seen;
  }

  bool reachesAny(const Value *v, const std::set<const Value *> &targets) {
    for (const Value *d : closure(v))
      if (targets.count(d))
        return true;
    return false;
  }

  /// The elements of a prim::ListConstruct, or the value itself.
  std::set<const Value *> listElements(const Value *list) {
    auto def = definingOp_.find(list);
    if (def != definingOp_.end() && def->second->name == "prim::ListConstruct")
      return {def->second->operands.begin(), def->second->operands.end()};
    return {list};
  }

  std::map<const Value *, std::set<const Value *>> deps_;
  std::vector<const Op *> gradOps_;
  std::map<const Value *, const Op *> definingOp_;
  std::map<const Value *, const Value *> parent_;
  std::vector<const Op *> inPlace_;
};

/// Whether `block` raises (prim::RaiseException among its own ops): it never completes.
bool raises(const ir::Block &block) {
  return std::any_of(block.ops.begin(), block.ops.end(),
                     [](const auto &op) { return op->name == "prim::RaiseException"; });
}

/// The parameters read in `block` or nested in it, outside regions that raise.
void collectReads(const ir::Block &block, std::set<std::string> &reads) {
  if (raises(block))
    return;
  for (const auto &op : block.ops) {
    if (op->name == "ganc.param")
      reads.insert(op->symbol);
    for (const auto &region : op->regions)
      collectReads(region, reads);
  }
}

/// The parameters a prim::If reads whichever way it goes: in every region that does not raise.
std::set<std::string> readsOnEveryPath(const Op &branch) {
  std::set<std::string> common;
  bool first = true;
  for (const auto &region : branch.regions) {
    if (raises(region))
      continue;
    std::set<std::string> reads;
    collectReads(region, reads);
    if (first)
      common = std::move(reads);
    else
      for (auto it = common.begin(); it != common.end();)
        it = reads.count(*it) ? std::next(it) : common.erase(it);
    first = false;
  }
  return common;
}

/// For every parameter read in `block`: whether all its reads so far sit inside a region of a
/// prim::If or prim::Loop (`inside`: `block` is such a region, or nested in one).
void markRegionReads(const ir::Block &block, bool inside, std::map<std::string, bool> &only) {
  auto read = [&](const std::string &name, bool inRegion) {
    auto [it, added] = only.emplace(name, inRegion);
    if (!added)
      it->second = it->second && inRegion;
  };
  for (const auto &op : block.ops) {
    if (op->name == "ganc.param")
      read(op->symbol, inside);
    const bool branches = op->name == "prim::If" || op->name == "prim::Loop";
    for (const auto &region : op->regions)
      markRegionReads(region, inside || branches, only);
    if (op->name == "prim::If")
      for (const std::string &name : readsOnEveryPath(*op))
        read(name, inside);
  }
}

/// The parameters a phase's graph gives a gradient: those its loss reaches through the forward
/// graph, or, for a phase whose joint graph is its only code, those the joint graph computes a
/// gradient for.
std::set<std::string> gradientReceivers(const ir::Phase &phase) {
  std::set<std::string> usedNames;
  if (phase.onlyJoint()) {
    for (const auto &op : phase.joint.ops)
      if (op->name == ir::joint::kGradient)
        usedNames.insert(op->symbol);
    return usedNames;
  }
  Reachability graph;
  graph.build(phase.body);
  graph.refineGradOps();
  std::set<const Value *> reached = graph.reach(phase.loss);
  phase.walk([&](const Op &op) {
    if (op.name == "ganc.param" && !op.results.empty() && reached.count(op.results[0]))
      usedNames.insert(op.symbol);
  });
  return usedNames;
}

} // namespace

Expected<bool> runUsedParams(ir::Module &module, const PassOptions &) {
  bool changed = false;
  for (auto &phase : module.phases) {
    if (!phase->loss && !phase->onlyJoint())
      return Status::error("phase @" + phase->name + " has no loss");
    std::set<std::string> usedNames = gradientReceivers(*phase);
    // A used parameter read only inside If/Loop regions is reached or not by data.
    std::map<std::string, bool> onlyInRegions;
    markRegionReads(phase->body, false, onlyInRegions);
    std::vector<std::string> used, unused, conditional;
    for (const ir::Tensor &p : module.parameters) {
      if (!phase->trains(p.name))
        continue;
      (usedNames.count(p.name) ? used : unused).push_back(p.name);
    }
    for (const std::string &name : used)
      if (onlyInRegions.count(name) && onlyInRegions[name])
        conditional.push_back(name);
    changed |= !phase->hasUsedFacts || used != phase->used || unused != phase->unused ||
               conditional != phase->conditional;
    phase->used = std::move(used);
    phase->unused = std::move(unused);
    phase->conditional = std::move(conditional);
    phase->hasUsedFacts = true;
  }
  return changed;
}

} // namespace ganc::passes
