// Checks the IR's invariants; run after every pass in tests and by ganc-opt.
#include "ir/Module.h"
#include "ir/PhaseAttrs.h"

#include <algorithm>
#include <map>
#include <set>

namespace ganc::ir {

namespace {

class Verifier {
public:
  explicit Verifier(const Module &m) : m_(m) {}

  Status run() {
    std::set<std::string> names;
    for (const Tensor &t : m_.parameters) {
      if (!names.insert(t.name).second)
        return Status::error("parameter @" + t.name + " is declared twice");
      if (!t.type.isTensor())
        return Status::error("parameter @" + t.name + " is not a tensor");
      if (t.bytes() < 0)
        return Status::error("parameter @" + t.name + " has no size that fits in int64 (" +
                             t.type.str() + ")");
    }
    for (const Tensor &t : m_.buffers)
      if (!names.insert(t.name).second)
        return Status::error("buffer @" + t.name + " is declared twice");
    GANC_TRY(verifyStages());
    if (m_.zeroStage < 0 || m_.zeroStage > 2)
      return Status::error("zero stage " + std::to_string(m_.zeroStage) +
                           " (ganc shards at 1 or 2)");
    if (m_.shardRanks < 0 || (m_.shardRanks > 0 && m_.zeroStage == 0))
      return Status::error("shards planned for " + std::to_string(m_.shardRanks) +
                           " ranks without a zero stage");
    std::set<std::string> scalers;
    for (const LossScaler &l : m_.lossScalers) {
      if (!scalers.insert(l.name).second)
        return Status::error("loss scaler \"" + l.name + "\" is declared twice");
      if (!(l.initScale > 0) || !(l.growthFactor > 1) || !(l.backoffFactor > 0) ||
          !(l.backoffFactor < 1) || l.growthInterval < 1)
        return Status::error("loss scaler \"" + l.name +
                             "\" needs init_scale > 0, growth_factor > 1, "
                             "backoff_factor in (0, 1) and growth_interval >= 1");
    }
    std::set<std::string> phaseNames;
    for (const auto &phase : m_.phases) {
      if (!phaseNames.insert(phase->key()).second)
        return Status::error("phase '" + phase->key() + "' is declared twice");
      GANC_TRY(verifyPhase(*phase).inPhase(phase->key()));
    }
    return Status::ok();
  }

private:
  /// Stages are declared once each, and with stages every phase belongs to one.
  Status verifyStages() {
    std::set<std::string> stages;
    for (const Stage &stage : m_.stages) {
      if (stage.name.empty())
        return Status::error("a stage has no name");
      if (!stages.insert(stage.name).second)
        return Status::error("stage \"" + stage.name + "\" is declared twice");
    }
    for (const auto &phase : m_.phases) {
      if (phase->stage.empty() && !stages.empty())
        return Status::error("phase @" + phase->name + " has no stage, but the module has stages");
      if (!phase->stage.empty() && !stages.count(phase->stage))
        return Status::error("phase @" + phase->name + " is specialised for undeclared stage \"" +
                             phase->stage + "\"");
    }
    return Status::ok();
  }

  Status verifyPhase(const Phase &p) {
    for (const PhaseAttr &attr : phaseAttrs())
      GANC_TRY(attr.check(p, m_));
    // Value names only need to be unique within a phase.
    defined_.clear();
    valueNames_.clear();
    for (const PhaseInput &input : p.inputs)
      GANC_TRY(define(input.value));
    GANC_TRY(verifyBlock(p.body));
    // Without a forward graph (ganc's own archive), the joint graph's ganc.loss is the loss.
    if (!p.loss && (!p.body.ops.empty() || p.joint.ops.empty()))
      return Status::error("has no returned loss");
    if (p.loss && !defined_.count(p.loss))
      return Status::error("returns undefined value %" + p.loss->name);
    GANC_TRY(verifyUsedFacts(p));
    GANC_TRY(verifyBuckets(p));
    if (!p.joint.ops.empty())
      if (Status s = verifyJoint(p); !s)
        return Status::error("joint graph: " + s.message());
    return Status::ok();
  }

  /// The joint graph: a scope of its own, one loss, one gradient per parameter the phase
  /// trains (the used parameters, once the analysis ran), and once placed, each bucket's
  /// collective exactly once, after its gradients, holding them.
  Status verifyJoint(const Phase &p) {
    defined_.clear();
    valueNames_.clear();
    GANC_TRY(verifyBlock(p.joint));
    int losses = 0;
    std::map<std::string, const Value *> gradientOf;
    for (const auto &op : p.joint.ops) {
      if (!op->regions.empty())
        return Status::error("op " + op->name + " has regions, which a joint graph has none of");
      if (op->name == joint::kLoss)
        ++losses;
      if (op->name != joint::kGradient)
        continue;
      if (op->operands.size() != 1)
        return Status::error("ganc.gradient @" + op->symbol + " takes one value");
      if (!m_.findParameter(op->symbol) || !p.trains(op->symbol))
        return Status::error("ganc.gradient @" + op->symbol +
                             " is not a parameter the phase updates");
      if (!gradientOf.emplace(op->symbol, op->operands[0]).second)
        return Status::error("ganc.gradient @" + op->symbol + " is given twice");
    }
    if (losses != 1)
      return Status::error("has " + std::to_string(losses) + " ganc.loss ops (one is its loss)");
    if (p.hasUsedFacts) {
      for (const auto &[name, value] : gradientOf)
        if (std::find(p.used.begin(), p.used.end(), name) == p.used.end())
          return Status::error("computes a gradient for @" + name +
                               ", which the used-parameter analysis finds unused");
      for (const std::string &name : p.used)
        if (!gradientOf.count(name))
          return Status::error("computes no gradient for @" + name +
                               ", which the used-parameter analysis finds used");
    }
    return verifyCollectives(p, gradientOf);
  }

  Status verifyCollectives(const Phase &p, const std::map<std::string, const Value *> &gradientOf) {
    std::vector<int> placed;
    for (const auto &op : p.joint.ops) {
      if (op->name != joint::kAllReduce && op->name != joint::kReduceScatter)
        continue;
      const Attribute *bucket = op->attribute("bucket");
      if (!bucket || !std::holds_alternative<int64_t>(*bucket) || std::get<int64_t>(*bucket) < 0 ||
          std::get<int64_t>(*bucket) >= static_cast<int64_t>(p.buckets.size()))
        return Status::error(op->name + " of no bucket of the phase");
      const int b = static_cast<int>(std::get<int64_t>(*bucket));
      const std::string where = op->name + " of bucket #" + std::to_string(b);
      if ((op->name == joint::kReduceScatter) != (m_.zeroStage == 2))
        return Status::error(where + ": with zero " + std::to_string(m_.zeroStage) +
                             " a bucket is " +
                             (m_.zeroStage == 2 ? "reduce-scattered" : "all-reduced"));
      const auto &slots = p.buckets[static_cast<size_t>(b)].slots;
      bool holds = op->operands.size() == slots.size();
      for (size_t i = 0; holds && i < slots.size(); ++i) {
        auto g = gradientOf.find(slots[i].parameter);
        holds = g != gradientOf.end() && g->second == op->operands[i];
      }
      if (!holds)
        return Status::error(where + " does not take the gradients of the bucket's slots, in "
                                     "their order");
      placed.push_back(b);
    }
    if (placed.empty())
      return Status::ok(); // not placed yet
    std::sort(placed.begin(), placed.end());
    for (size_t i = 0; i < placed.size() || i < p.buckets.size(); ++i)
      if (i >= placed.size() || placed[i] != static_cast<int>(i))
        return Status::error("does not reduce every bucket exactly once");
    return Status::ok();
  }

  Status define(const Value *v) {
    if (!valueNames_.insert(v->name).second)
      return Status::error("value %" + v->name + " is defined twice");
    defined_.insert(v);
    return Status::ok();
  }

  Status verifyBlock(const Block &block) {
    for (const Value *arg : block.arguments)
      GANC_TRY(define(arg));
    for (const auto &op : block.ops) {
      for (const Value *operand : op->operands)
        if (!defined_.count(operand))
          return Status::error("op " + op->name + " uses %" + operand->name +
                               " before it is defined");
      if (op->name == "ganc.param" && !m_.findParameter(op->symbol))
        return Status::error("ganc.param reads unknown parameter @" + op->symbol);
      if (op->name == "ganc.buffer" &&
          std::none_of(m_.buffers.begin(), m_.buffers.end(),
                       [&](const Tensor &b) { return b.name == op->symbol; }))
        return Status::error("ganc.buffer reads unknown buffer @" + op->symbol);
      for (const Block &region : op->regions)
        GANC_TRY(verifyBlock(region));
      for (const Value *result : op->results) {
        if (result->definingOp != op.get())
          return Status::error("result %" + result->name + " of " + op->name +
                               " does not point back to its op");
        GANC_TRY(define(result));
      }
    }
    for (const Value *y : block.yields)
      if (!defined_.count(y))
        return Status::error("yield of undefined value %" + y->name);
    return Status::ok();
  }

  Status verifyUsedFacts(const Phase &p) {
    if (!p.hasUsedFacts)
      return Status::ok();
    std::set<std::string> seen;
    for (const auto *list : {&p.used, &p.unused})
      for (const std::string &name : *list) {
        const Tensor *param = m_.findParameter(name);
        if (!param)
          return Status::error("fact names unknown parameter @" + name);
        if (!p.trains(name))
          return Status::error("parameter @" + name + " is not under any path the phase updates");
        if (!seen.insert(name).second)
          return Status::error("parameter @" + name + " is listed twice in used/unused");
      }
    for (const std::string &name : p.conditional)
      if (std::find(p.used.begin(), p.used.end(), name) == p.used.end())
        return Status::error("conditional parameter @" + name + " is not a used parameter");
    if (!p.readyOrder.empty()) {
      std::vector<std::string> a = p.readyOrder, b = p.used;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b)
        return Status::error("ready order is not a permutation of the used parameters");
    }
    return Status::ok();
  }

  /// A sharded bucket: every shard holds each parameter's largest piece (rank 0's) at an
  /// aligned offset, pieces apart, within the shard; an unsharded plan has no shard layout.
  Status verifyShards(const Bucket &b) {
    const bool planned = m_.shardRanks > 1;
    if (!planned)
      return b.shardBytes == 0 ? Status::ok()
                               : Status::error("has a shard layout but the plan is not sharded");
    if (b.shardBytes <= 0 || b.shardBytes % kBucketAlignment != 0)
      return Status::error("shard of " + std::to_string(b.shardBytes) +
                           " bytes (sharded buckets need positive, aligned shards)");
    int64_t end = 0;
    for (const Bucket::Slot &slot : b.slots) {
      const int64_t element = Type::elementSize(b.dtype);
      const int64_t piece = pieceOf(slot.bytes / element, m_.shardRanks, 0).length * element;
      if (slot.shardOffset % kBucketAlignment != 0 || slot.shardOffset < end)
        return Status::error("@" + slot.parameter + " at shard offset " +
                             std::to_string(slot.shardOffset) + " is unaligned or overlaps");
      end = slot.shardOffset + piece;
    }
    if (end > b.shardBytes)
      return Status::error("shard of " + std::to_string(b.shardBytes) +
                           " bytes is smaller than its pieces");
    return Status::ok();
  }

  Status verifyBuckets(const Phase &p) {
    if (p.buckets.empty() && p.schedule.empty())
      return Status::ok();
    std::map<std::string, int> bucketOf;
    for (size_t i = 0; i < p.buckets.size(); ++i) {
      const Bucket &b = p.buckets[i];
      std::string where = "bucket #" + std::to_string(i);
      if (b.slots.empty())
        return Status::error(where + " is empty");
      int64_t end = 0;
      for (const Bucket::Slot &slot : b.slots) {
        const Tensor *param = m_.findParameter(slot.parameter);
        if (!param)
          return Status::error(where + " holds unknown parameter @" + slot.parameter);
        if (!bucketOf.emplace(slot.parameter, static_cast<int>(i)).second)
          return Status::error("parameter @" + slot.parameter + " is in two buckets");
        if (param->type.dtype != b.dtype)
          return Status::error(where + " is " + b.dtype + " but holds " + param->type.dtype +
                               " parameter @" + slot.parameter);
        if (slot.offset % kBucketAlignment != 0)
          return Status::error(where + ": @" + slot.parameter + " at unaligned offset " +
                               std::to_string(slot.offset));
        if (slot.offset < end)
          return Status::error(where + ": @" + slot.parameter + " overlaps the slot before it");
        if (slot.bytes != param->bytes())
          return Status::error(where + ": @" + slot.parameter + " slot has " +
                               std::to_string(slot.bytes) + " bytes, the parameter " +
                               std::to_string(param->bytes()));
        end = slot.offset + slot.bytes;
      }
      // A bucket ends at its last slot: an edited size is refused here, not by the allocator.
      if (end != b.bytes)
        return Status::error(where + " has " + std::to_string(b.bytes) +
                             " bytes but its slots end at " + std::to_string(end) +
                             " (a bucket ends at its last slot)");
      GANC_TRY(verifyShards(b).withContext(where));
      const int64_t first = p.firstBucketCapBytes ? p.firstBucketCapBytes : m_.firstBucketCapBytes;
      const int64_t rest = p.bucketCapBytes ? p.bucketCapBytes : m_.bucketCapBytes;
      int64_t cap = i == 0 ? first : rest;
      if (cap > 0 && b.slots.size() > 1 && end > cap)
        return Status::error(where + " holds " + std::to_string(end) + " bytes, over its cap of " +
                             std::to_string(cap));
    }
    if (p.hasUsedFacts)
      for (const std::string &name : p.used)
        if (!bucketOf.count(name))
          return Status::error("used parameter @" + name + " is in no bucket");
    std::vector<int> scheduled;
    for (const ScheduledAllReduce &s : p.schedule) {
      if (s.bucket < 0 || s.bucket >= static_cast<int>(p.buckets.size()))
        return Status::error("all-reduce of unknown bucket #" + std::to_string(s.bucket));
      auto it = bucketOf.find(s.afterParameter);
      if (it == bucketOf.end() || it->second != s.bucket)
        return Status::error("bucket #" + std::to_string(s.bucket) + " is reduced after @" +
                             s.afterParameter + ", which it does not hold");
      scheduled.push_back(s.bucket);
    }
    if (p.schedule.empty())
      return Status::ok(); // not scheduled yet
    std::sort(scheduled.begin(), scheduled.end());
    bool coversEachOnce = scheduled.size() == p.buckets.size();
    for (size_t i = 0; coversEachOnce && i < scheduled.size(); ++i)
      coversEachOnce = scheduled[i] == static_cast<int>(i);
    if (!coversEachOnce)
      return Status::error("the all-reduce schedule does not cover every bucket exactly once");
    return Status::ok();
  }

  const Module &m_;
  std::set<const Value *> defined_;
  std::set<std::string> valueNames_;
};

} // namespace

Status verifyInvariants(const Module &module) { return Verifier(module).run(); }

Status verifyModelRules(const Module &module) {
  // Which stage's phases use which parameters; only meaningful once used-params ran on all.
  if (module.stages.empty())
    return Status::ok();
  for (const auto &phase : module.phases)
    if (!phase->hasUsedFacts)
      return Status::ok();
  auto inBlock = [](const std::string &parameter, const std::string &block) {
    return parameter.compare(0, block.size() + 1, block + ".") == 0;
  };
  const std::vector<Stage> &stages = module.stages;
  std::vector<std::set<std::string>> usedIn;
  for (const Stage &stage : stages)
    usedIn.push_back(module.usedInStage(stage.name));
  for (size_t i = 0; i < stages.size(); ++i) {
    for (const std::string &block : stages[i].grows) {
      std::string where = "stage '" + stages[i].name + "' grows '" + block + "'";
      if (std::none_of(module.parameters.begin(), module.parameters.end(),
                       [&](const Tensor &p) { return inBlock(p.name, block); }))
        return Status::error(where + ", which has no parameters");
      if (std::none_of(usedIn[i].begin(), usedIn[i].end(),
                       [&](const std::string &p) { return inBlock(p, block); }))
        return Status::error(where + ", but none of the stage's phases uses its parameters");
      for (size_t j = 0; j < i; ++j)
        for (const std::string &p : usedIn[j])
          if (inBlock(p, block))
            return Status::error(where + ", but the earlier stage '" + stages[j].name +
                                 "' already uses '" + p + "'");
    }
  }
  return Status::ok();
}

Status verify(const Module &module) {
  GANC_TRY(verifyInvariants(module));
  return verifyModelRules(module);
}

} // namespace ganc::ir
