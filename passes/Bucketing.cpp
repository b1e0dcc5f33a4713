// bucketing: pack each phase's used parameters into all-reduce buckets, in ready order.
//
// Algorithm (DDP's compute_bucket_assignment_by_size, with XLA's combiner vocabulary). Walk
// the ready order one op group at a time (the parameters an op consumes first stay together,
// see ready-order). Each compatibility key (dtype, device) has one open bucket; a group that
// would push its bucket past the cap closes the bucket first. The first bucket closed uses the
// small first-bucket cap so that communication starts early in backward; the rest use the
// main cap (a phase with caps of its own, autotuned, uses those). A group larger than the cap
// on its own is split by parameter; a single parameter larger than the cap gets a bucket of
// its own. Slots start at ir::kBucketAlignment-byte offsets.
//
// Invariant left: every used parameter is in exactly one bucket, slots are aligned and do
// not overlap, and no bucket of more than one parameter exceeds its cap.
#include "passes/FirstUse.h"
#include "passes/Pass.h"

#include <algorithm>

#include <map>

namespace ganc::passes {

namespace {

int64_t alignUp(int64_t n) {
  return (n + ir::kBucketAlignment - 1) / ir::kBucketAlignment * ir::kBucketAlignment;
}

class BucketBuilder {
public:
  explicit BucketBuilder(const PassOptions &o) : o_(o) {}

  void addGroup(const std::vector<const ir::Tensor *> &group) {
    int64_t groupBytes = 0;
    for (const ir::Tensor *p : group)
      groupBytes += alignUp(p->bytes());
    if (group.size() > 1 && groupBytes > currentCap()) {
      for (const ir::Tensor *p : group)
        addGroup({p});
      return;
    }
    const std::string key = group.front()->type.dtype;
    auto open = openBucket_.find(key);
    if (open != openBucket_.end() &&
        alignUp(buckets_[open->second].bytes) + groupBytes > capOf(open->second)) {
      openBucket_.erase(open);
      open = openBucket_.end();
    }
    if (open == openBucket_.end()) {
      ir::Bucket b;
      b.dtype = key;
      b.device = "any";
      buckets_.push_back(b);
      open = openBucket_.emplace(key, static_cast<int>(buckets_.size() - 1)).first;
    }
    ir::Bucket &b = buckets_[open->second];
    for (const ir::Tensor *p : group) {
      ir::Bucket::Slot slot{p->name, alignUp(b.bytes), p->bytes()};
      b.bytes = slot.offset + slot.bytes;
      b.slots.push_back(slot);
    }
  }

  std::vector<ir::Bucket> take() { return std::move(buckets_); }

private:
  int64_t capOf(int index) const { return index == 0 ? o_.firstBucketCapBytes : o_.bucketCapBytes; }
  int64_t currentCap() const {
    return buckets_.empty() ? o_.firstBucketCapBytes : o_.bucketCapBytes;
  }

  const PassOptions &o_;
  std::vector<ir::Bucket> buckets_;
  std::map<std::string, int> openBucket_;
};

} // namespace

Expected<bool> runBucketing(ir::Module &module, const PassOptions &options) {
  if (options.bucketCapBytes <= 0 || options.firstBucketCapBytes <= 0)
    return Status::error("bucket caps must be positive");
  module.bucketCapBytes = options.bucketCapBytes;
  module.firstBucketCapBytes = options.firstBucketCapBytes;
  for (auto &phase : module.phases) {
    if (phase->readyOrder.size() != phase->used.size())
      return Status::error("phase @" + phase->name + ": bucketing needs ready-order first");
    std::map<std::string, FirstUse> first = firstUses(*phase);
    PassOptions caps = options; // a phase's own caps (autotuned) over the module's
    if (phase->bucketCapBytes)
      caps.bucketCapBytes = phase->bucketCapBytes;
    if (phase->firstBucketCapBytes)
      caps.firstBucketCapBytes = phase->firstBucketCapBytes;
    BucketBuilder builder(caps);
    std::vector<const ir::Tensor *> group;
    int64_t groupOp = -1;
    for (const std::string &name : phase->readyOrder) {
      const ir::Tensor *p = module.findParameter(name);
      if (!p || p->bytes() <= 0)
        return Status::error("phase @" + phase->name + ": parameter @" + name +
                             " has no known size");
      int64_t op = first.count(name) ? first[name].opIndex : FirstUse::kNever;
      if (!group.empty() &&
          (op != groupOp || op == FirstUse::kNever || p->type.dtype != group.front()->type.dtype)) {
        builder.addGroup(group);
        group.clear();
      }
      group.push_back(p);
      groupOp = op;
    }
    if (!group.empty())
      builder.addGroup(group);
    phase->buckets = builder.take();
    // The joint graph's collectives were the old buckets'; joint-schedule places the new ones.
    auto &ops = phase->joint.ops;
    ops.erase(std::remove_if(ops.begin(), ops.end(),
                             [](const std::unique_ptr<ir::Op> &op) {
                               return op->name == ir::joint::kAllReduce ||
                                      op->name == ir::joint::kReduceScatter;
                             }),
              ops.end());
  }
  return true;
}

} // namespace ganc::passes
