// `ganc explain` and `--emit json|report`: views of a plan for people and for other tools.
#include "tools/Report.h"

#include "ir/PhaseAttrs.h"
#include "support/TextFormat.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

namespace ganc::tools {

std::string humanBytes(int64_t bytes) {
  char buffer[32];
  if (bytes < 1024)
    std::snprintf(buffer, sizeof(buffer), "%lld B", static_cast<long long>(bytes));
  else if (bytes < 1024 * 1024)
    std::snprintf(buffer, sizeof(buffer), "%.1f KiB", bytes / 1024.0);
  else
    std::snprintf(buffer, sizeof(buffer), "%.2f MiB", bytes / (1024.0 * 1024.0));
  return buffer;
}

namespace {

std::string pad(const std::string &s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

std::string microseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f us", seconds * 1e6);
  return text;
}

int64_t bucketBytes(const ir::Phase &phase) {
  int64_t total = 0;
  for (const ir::Bucket &b : phase.buckets)
    total += b.bytes;
  return total;
}

/// Sharded: the bytes of one phase's buckets in their rank-major layout (what is
/// reduce-scattered or all-reduced, and all-gathered, per run).
int64_t shardedBytes(const ir::Module &plan, const ir::Phase &phase) {
  int64_t total = 0;
  for (const ir::Bucket &b : phase.buckets)
    total += b.shardBytes * plan.shardRanks;
  return total;
}

/// Bytes of one moment buffer (Adam keeps two, SGD with momentum one) over every trained
/// parameter: per rank under the plan's sharding (rank 0's pieces, the largest), and whole.
std::pair<int64_t, int64_t> momentBytes(const ir::Module &plan) {
  int64_t perRank = 0;
  int64_t whole = 0;
  for (const ir::Tensor &p : plan.parameters) {
    if (p.group.empty())
      continue;
    const int64_t element = ir::Type::elementSize(p.type.dtype);
    whole += p.bytes();
    perRank += plan.shardRanks > 1
                   ? ir::pieceOf(p.bytes() / element, plan.shardRanks, 0).length * element
                   : p.bytes();
  }
  return {perRank, whole};
}

double bytesPerStep(const ir::Module &plan, const std::string &stage) {
  double perStep = 0;
  for (const auto &phase : plan.phases)
    if (phase->stage == stage)
      perStep += static_cast<double>(bucketBytes(*phase)) / static_cast<double>(phase->interval);
  return perStep;
}

/// A stage's summary: how much of the model it trains, and what it adds to the previous one.
void stageHeader(std::ostream &out, const ir::Module &plan, const std::string &stage,
                 const std::string &previous) {
  std::set<std::string> used = plan.usedInStage(stage);
  out << "\n== stage " << stage << ": trains " << used.size() << " of " << plan.parameters.size()
      << " parameters, all-reduces " << humanBytes(static_cast<int64_t>(bytesPerStep(plan, stage)))
      << " per step (amortised over intervals)\n";
  if (previous.empty())
    return;
  std::set<std::string> before = plan.usedInStage(previous);
  std::vector<std::string> added, dropped;
  for (const std::string &p : used)
    if (!before.count(p))
      added.push_back(p);
  for (const std::string &p : before)
    if (!used.count(p))
      dropped.push_back(p);
  auto list = [&](const char *what, const std::vector<std::string> &names) {
    out << "  " << what << " stage " << previous << ": " << names.size() << "\n";
    for (const std::string &name : names)
      out << "    " << name << "\n";
  };
  list("newly trained since", added);
  if (!dropped.empty())
    list("no longer trained since", dropped);
}

/// The phase's training-step features: each phase attribute's line (PhaseAttrs.def), and the
/// synchronised batch norms lowering put in.
void stepFeatures(std::ostream &out, const ir::Phase &phase) {
  for (const ir::PhaseAttr &attr : ir::phaseAttrs()) {
    std::istringstream lines(attr.explain(phase));
    for (std::string line; std::getline(lines, line);)
      out << "  " << line << "\n";
  }
  int syncBatchNorms = 0;
  phase.walk([&](const ir::Op &op) { syncBatchNorms += op.name == "ganc::sync_batch_norm"; });
  if (syncBatchNorms > 0)
    out << "  synchronised batch norm: " << syncBatchNorms
        << " batch norm op(s) rewritten to ganc::sync_batch_norm (statistics and backward sums "
           "over every rank)\n";
}

/// What the phase does not train: the submodules it never all-reduces, the frozen parameters
/// inside the ones it trains in part (fine-tuning), and the optimizer groups it steps.
void frozenLines(std::ostream &out, const ir::Module &plan, const ir::Phase &phase,
                 const std::set<std::string> &owners) {
  std::map<std::string, int> frozenIn, trainedIn, groups;
  for (const ir::Tensor &p : plan.parameters) {
    const bool trained = phase.trains(p.name);
    (trained ? trainedIn : frozenIn)[p.owner]++;
    if (trained)
      groups[p.group]++;
  }
  std::vector<std::string> untouched, partly;
  for (const std::string &owner : owners) {
    std::string name = owner.empty() ? "(top level)" : owner;
    if (!trainedIn.count(owner))
      untouched.push_back(name);
    else if (frozenIn.count(owner))
      partly.push_back(name + " (" + std::to_string(frozenIn[owner]) + " of " +
                       std::to_string(frozenIn[owner] + trainedIn[owner]) + " parameters)");
  }
  auto list = [&](const char *what, const std::vector<std::string> &names) {
    if (names.empty())
      return;
    out << "  " << what << ": ";
    for (size_t i = 0; i < names.size(); ++i)
      out << (i ? ", " : "") << names[i];
    out << "\n";
  };
  list("not updated here (never all-reduced in this phase)", untouched);
  list("frozen here inside trained submodules (no gradient, no all-reduce, no update)", partly);
  std::vector<std::string> stepped;
  for (const auto &[group, count] : groups)
    stepped.push_back(group + " (" + std::to_string(count) + ")");
  if (groups.size() > 1 || (groups.size() == 1 && !owners.count(groups.begin()->first)))
    list("optimizer groups stepped (parameters)", stepped);
}

} // namespace

std::string summary(const ir::Module &plan, const std::string &path) {
  std::ostringstream out;
  out << "wrote " << path << ": " << plan.name << ", " << plan.phases.size() << " phase"
      << (plan.phases.size() == 1 ? "" : "s") << " (";
  for (size_t i = 0; i < plan.phases.size(); ++i) {
    const ir::Phase &phase = *plan.phases[i];
    int64_t bytes = 0;
    for (const ir::Bucket &b : phase.buckets)
      bytes += b.bytes;
    out << (i ? "; " : "") << phase.key() << ": " << phase.used.size() << " parameters, "
        << phase.buckets.size() << " bucket" << (phase.buckets.size() == 1 ? "" : "s") << ", "
        << humanBytes(bytes);
  }
  out << " all-reduced per run); see ganc explain " << path;
  return out.str();
}

namespace {

/// The plan's own lines: name, caps, loss scalers, sharded optimizer state.
void planHeader(std::ostream &out, const ir::Module &plan) {
  out << "plan for " << plan.name << " (model " << plan.identity << ")";
  if (plan.bucketCapBytes)
    out << ", bucket caps: first " << humanBytes(plan.firstBucketCapBytes) << ", then "
        << humanBytes(plan.bucketCapBytes);
  out << "\n";
  for (const ir::LossScaler &l : plan.lossScalers)
    out << "loss scaler " << l.name << ": scale " << formatDouble(l.initScale) << " at first, x"
        << formatDouble(l.growthFactor) << " after " << l.growthInterval
        << " steps without inf/NaN, x" << formatDouble(l.backoffFactor)
        << " and the step skipped on one\n";
  if (plan.zeroStage && plan.shardRanks > 1) {
    auto [perRank, whole] = momentBytes(plan);
    out << "sharded optimizer state (zero " << plan.zeroStage << ") over " << plan.shardRanks
        << " ranks: each rank keeps and steps its piece of every parameter; optimizer state per "
           "rank "
        << humanBytes(perRank) << " per moment buffer (Adam keeps two), unsharded "
        << humanBytes(whole) << "\n";
  } else if (plan.zeroStage) {
    out << "sharded optimizer state (zero " << plan.zeroStage
        << "): the shards are laid out when the run starts, for its number of ranks "
           "(ganc compile --ranks N shows them here)\n";
  }
}

/// A phase's used, unused and conditional parameters with their sizes.
void parameterLines(std::ostream &out, const ir::Module &plan, const ir::Phase &phase) {
  auto list = [&](const std::vector<std::string> &names) {
    for (const std::string &name : names) {
      const ir::Tensor *p = plan.findParameter(name);
      out << "    " << pad(name, 44) << pad(p->type.str(), 22) << humanBytes(p->bytes()) << "\n";
    }
  };
  int64_t usedBytes = 0;
  for (const std::string &name : phase.used)
    usedBytes += plan.findParameter(name)->bytes();
  out << "  used parameters: " << phase.used.size() << " (" << humanBytes(usedBytes) << ")\n";
  list(phase.used);
  out << "  unused parameters (no all-reduce, no update, grad stays None): " << phase.unused.size()
      << "\n";
  list(phase.unused);
  if (!phase.conditional.empty()) {
    out << "  reached only under a branch on data (a prim::If or prim::Loop region; which "
           "were reached is all-reduced after backward, and one no rank reached keeps grad "
           "None and is not stepped, as in eager DDP): "
        << phase.conditional.size() << "\n";
    for (const std::string &name : phase.conditional)
      out << "    " << name << "\n";
  }
}

/// A phase's buckets in all-reduce order, their bytes, autotuning and sharding.
void bucketLines(std::ostream &out, const ir::Module &plan, const ir::Phase &phase) {
  if (!phase.schedule.empty()) {
    out << "  all-reduce order:\n";
    for (const ir::ScheduledAllReduce &s : phase.schedule) {
      const ir::Bucket &b = phase.buckets[s.bucket];
      out << "    bucket #" << s.bucket << ": " << b.slots.size() << " parameter"
          << (b.slots.size() == 1 ? ", " : "s, ") << humanBytes(b.bytes) << " " << b.dtype
          << ", launched after the gradient of " << s.afterParameter << "\n";
    }
  }
  out << "  all-reduced per run: " << humanBytes(bucketBytes(phase)) << " in "
      << phase.buckets.size() << " bucket" << (phase.buckets.size() == 1 ? "" : "s") << "\n";
  if (phase.tunedRanks) {
    const bool oneBucket = phase.bucketCapBytes >= (int64_t{1} << 50);
    out << "  buckets autotuned for " << phase.tunedRanks << " ranks: "
        << (oneBucket ? std::string("one bucket")
                      : "cap " + humanBytes(phase.bucketCapBytes) + ", first " +
                            humanBytes(phase.firstBucketCapBytes))
        << "; predicted communication exposed after backward "
        << microseconds(phase.tunedExposedSeconds)
        << " (DDP's 25 MiB / 1 MiB caps: " << microseconds(phase.defaultExposedSeconds) << ")\n";
  }
  if (plan.shardRanks > 1) {
    const int64_t sharded = shardedBytes(plan, phase);
    out << "  sharded (zero " << plan.zeroStage << ", " << plan.shardRanks
        << " ranks): " << (plan.zeroStage == 2 ? "reduce-scattered " : "all-reduced ")
        << humanBytes(sharded) << " per run instead (one shard per rank), then "
        << humanBytes(sharded) << " of updated parameters all-gathered\n";
  }
}

/// Where the phase's joint graph starts each bucket's collective: after which of its ops, and
/// how many ops are left to run beside it.
void jointLines(std::ostream &out, const ir::Phase &phase) {
  if (phase.joint.ops.empty()) {
    out << "  door: TorchScript and autograd (the archive keeps no joint graph for it: "
           "ganc.export said why it captured none)\n";
    return;
  }
  if (phase.onlyJoint())
    out << "  door: its joint graph through ganc's executor on the CPU, its only code (the "
           "archive was exported without TorchScript)\n";
  else if (!phase.jointDeclined().empty())
    out << "  door: TorchScript and autograd (" << phase.jointDeclined()
        << "; ganc train --executor joint takes the graph as captured)\n";
  else
    out << "  door: its joint graph through ganc's executor on the CPU (ganc train --executor "
           "auto, the default); TorchScript and autograd on CUDA\n";
  auto computes = [](const ir::Op &op) { return ir::joint::isNode(op.name); };
  size_t total = 0;
  for (const auto &op : phase.joint.ops)
    total += computes(*op) ? 1 : 0;
  out << "  joint graph: " << total << " ops (forward, its autograd.grad calls, the gradients)\n";
  size_t done = 0;
  const ir::Op *last = nullptr;
  for (const auto &op : phase.joint.ops) {
    if (computes(*op)) {
      ++done;
      last = op.get();
      continue;
    }
    const ir::Attribute *bucket = op->attribute("bucket");
    if (!bucket || !std::holds_alternative<int64_t>(*bucket))
      continue;
    out << "    " << (op->name == ir::joint::kReduceScatter ? "reduce-scatter" : "all-reduce")
        << " of bucket #" << std::get<int64_t>(*bucket) << " starts after op " << done << " of "
        << total;
    if (last && !last->results.empty())
      out << " (" << last->name << ", %" << last->results[0]->name << ")";
    out << ": " << total - done << (total - done == 1 ? " op" : " ops") << " left to overlap it\n";
  }
}

} // namespace

std::string explain(const ir::Module &plan) {
  std::ostringstream out;
  planHeader(out, plan);
  std::set<std::string> owners;
  for (const ir::Tensor &p : plan.parameters)
    owners.insert(p.owner);
  std::string stage;
  for (const auto &phase : plan.phases) {
    if (phase->stage != stage) {
      stageHeader(out, plan, phase->stage, stage);
      stage = phase->stage;
    }
    out << "\nphase " << phase->name;
    if (!phase->stage.empty())
      out << " (stage " << phase->stage << ")";
    out << ": method " << phase->method << ", every " << phase->interval << " step"
        << (phase->interval == 1 ? "" : "s") << ", updates ";
    for (size_t i = 0; i < phase->updates.size(); ++i)
      out << (i ? ", " : "") << phase->updates[i];
    out << "\n";
    stepFeatures(out, *phase);
    if (phase->hasCaptureFacts)
      out << "  replay on CUDA: "
          << (!phase->eagerReason.empty() ? "eager (" + phase->eagerReason + ")"
              : phase->sharesValues()
                  ? "CUDA Graph, one with the phases and sections it shares values with"
                  : "CUDA Graph")
          << "\n";
    parameterLines(out, plan, *phase);
    frozenLines(out, plan, *phase, owners);
    bucketLines(out, plan, *phase);
    jointLines(out, *phase);
  }
  if (stage.empty())
    out << "\nall-reduced per training step (amortised over intervals): "
        << humanBytes(static_cast<int64_t>(bytesPerStep(plan, ""))) << "\n";
  return out.str();
}

std::string planJson(const ir::Module &plan) {
  using nlohmann::json;
  json j;
  j["name"] = plan.name;
  j["identity"] = plan.identity;
  j["bucket_cap_bytes"] = plan.bucketCapBytes;
  j["first_bucket_cap_bytes"] = plan.firstBucketCapBytes;
  j["zero"] = plan.zeroStage;
  j["shard_ranks"] = plan.shardRanks;
  {
    auto [perRank, whole] = momentBytes(plan);
    j["moment_bytes"] = {{"per_rank", perRank}, {"unsharded", whole}};
  }
  j["parameters"] = json::array();
  for (const ir::Tensor &p : plan.parameters)
    j["parameters"].push_back({{"name", p.name},
                               {"type", p.type.str()},
                               {"owner", p.owner},
                               {"group", p.group},
                               {"bytes", p.bytes()}});
  j["phases"] = json::array();
  for (const auto &phase : plan.phases) {
    json ph = {{"name", phase->name},
               {"stage", phase->stage},
               {"method", phase->method},
               {"updates", phase->updates},
               {"interval", phase->interval},
               {"accumulate", phase->accumulate},
               {"autocast", phase->autocast.empty() ? "f32" : phase->autocast},
               {"loss_scaler", phase->lossScaler},
               {"used", phase->used},
               {"unused", phase->unused},
               {"conditional", phase->conditional},
               {"ready_order", phase->readyOrder},
               {"eager_reason", phase->eagerReason},
               {"bucket_cap_bytes", phase->bucketCapBytes},
               {"first_bucket_cap_bytes", phase->firstBucketCapBytes},
               {"tuned_ranks", phase->tunedRanks},
               {"tuned_exposed_seconds", phase->tunedExposedSeconds},
               {"default_exposed_seconds", phase->defaultExposedSeconds}};
    ph["fused"] = {{"upfirdn2d", phase->fusedResamplings}, {"bias_act", phase->fusedBiasActs}};
    ph["double_backward"] = phase->doubleBackward;
    ph["not_fused"] = json::array();
    for (const ir::NotFused &miss : phase->notFused)
      ph["not_fused"].push_back({{"pattern", miss.pattern}, {"why", miss.why}});
    ph["clip_grad_norm"] = json::array();
    for (const ir::ClipGradNorm &clip : phase->clips)
      ph["clip_grad_norm"].push_back(
          {{"group", clip.group},
           {"max_norm", clip.maxNorm},
           {"norm_type", std::isinf(clip.normType) ? json("inf") : json(clip.normType)}});
    ph["buckets"] = json::array();
    for (const ir::Bucket &b : phase->buckets) {
      json slots = json::array();
      for (const ir::Bucket::Slot &s : b.slots)
        slots.push_back({{"parameter", s.parameter},
                         {"offset", s.offset},
                         {"bytes", s.bytes},
                         {"shard_offset", s.shardOffset}});
      ph["buckets"].push_back({{"dtype", b.dtype},
                               {"bytes", b.bytes},
                               {"shard_bytes", b.shardBytes},
                               {"slots", slots}});
    }
    ph["schedule"] = json::array();
    for (const ir::ScheduledAllReduce &s : phase->schedule)
      ph["schedule"].push_back({{"bucket", s.bucket}, {"after", s.afterParameter}});
    j["phases"].push_back(ph);
  }
  return j.dump(2) + "\n";
}

} // namespace ganc::tools
