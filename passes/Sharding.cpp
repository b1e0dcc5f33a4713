// sharding: lay each bucket out by rank for sharded optimizer state (ZeRO stage 1 and 2).
//
// Every parameter is split into `ranks` pieces of its elements in memory order, balanced to
// one element (ir::pieceOf). Rank r owns piece r of every parameter — the same elements in
// every phase, so one rank's optimizer state for a parameter serves all the phases that train
// it, whichever bucket holds it there (FSDP2 shards per parameter for the same reason). Each
// bucket then gets a rank-major layout: shard r is rank r's pieces of the bucket's
// parameters at aligned offsets, and all shards have the size of the largest (rank 0's). A
// reduce-scatter of the bucket leaves each rank the averaged gradient of exactly its pieces;
// an all-gather of the updated pieces rebuilds the parameters.
//
// Invariant left: with a zero stage and ranks > 1, every bucket has an aligned shard size and
// every slot an aligned shard offset, pieces apart; otherwise no bucket has a shard layout.
#include "passes/Pass.h"

namespace ganc::passes {

namespace {

int64_t alignUp(int64_t n) {
  return (n + ir::kBucketAlignment - 1) / ir::kBucketAlignment * ir::kBucketAlignment;
}

} // namespace

Expected<bool> runSharding(ir::Module &module, const PassOptions &options) {
  if (options.zeroStage > 2)
    return Status::error("zero stage " + std::to_string(options.zeroStage) +
                         ": ganc shards optimizer state at stage 1 or 2 (0: off)");
  if (options.zeroStage >= 0)
    module.zeroStage = options.zeroStage;
  const int64_t ranks = module.zeroStage > 0 && options.ranks > 1 ? options.ranks : 0;
  const bool changed = module.shardRanks != ranks;
  module.shardRanks = ranks;
  for (auto &phase : module.phases)
    for (ir::Bucket &bucket : phase->buckets) {
      int64_t end = 0;
      for (ir::Bucket::Slot &slot : bucket.slots) {
        if (ranks == 0) {
          slot.shardOffset = 0;
          continue;
        }
        const int64_t element = ir::Type::elementSize(bucket.dtype);
        if (element <= 0)
          return Status::error("phase @" + phase->name + ": bucket of unknown dtype " +
                               bucket.dtype);
        slot.shardOffset = alignUp(end);
        end = slot.shardOffset + ir::pieceOf(slot.bytes / element, ranks, 0).length * element;
      }
      bucket.shardBytes = ranks ? alignUp(end) : 0;
    }
  return changed;
}

} // namespace ganc::passes
