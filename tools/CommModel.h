// The communication model `ganc simulate` and `ganc compile --bucket-cap-mb auto` share:
// link classes and the alpha-beta time of an all-reduce.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ganc::tools {

struct Link {
  double alpha;     // seconds per step of the algorithm
  double bandwidth; // bytes per second (bus bandwidth, in NCCL's sense)
};

/// Documented defaults: NVLink 4 (8 x H100, NCCL bus bandwidth), InfiniBand NDR 400 Gb/s per
/// GPU, 100 Gb/s Ethernet (RoCE), and one host's loopback under Gloo.
const std::map<std::string, Link> &links();

/// An all-reduce of `bytes` over `ranks`: the faster of a ring, 2(N-1) alpha + 2(N-1)/N B /
/// beta, and a double binary tree, 2 ceil(log2 N) alpha + 2 B / beta (NCCL chooses the same
/// way); 0 for one rank.
double allReduceSeconds(int64_t bytes, int64_t ranks, const Link &link);

/// A bucket to reduce: its bytes and when its last gradient is ready (seconds into the phase).
struct ReadyBucket {
  int64_t bytes = 0;
  double ready = 0;
};

/// When the last of `buckets` (in launch order, one at a time on one channel, each once it is
/// ready and the one before it is done) finishes, in seconds into the phase.
double lastReduceEnd(const std::vector<ReadyBucket> &buckets, int64_t ranks, const Link &link,
                     double slowdown = 1.0);

} // namespace ganc::tools
