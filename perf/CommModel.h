// The communication model `ganc simulate` and `ganc compile --bucket-cap-mb auto` share:
// link classes and the alpha-beta time of an all-reduce.
#pragma once

#include "support/Options.h"
#include "support/Status.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ganc::perf {

struct Link {
  double alpha;     // seconds per step of the algorithm
  double bandwidth; // bytes per second (bus bandwidth, in NCCL's sense)
};

/// Documented defaults: NVLink 4 (8 x H100, NCCL bus bandwidth), InfiniBand NDR 400 Gb/s per
/// GPU, 100 Gb/s Ethernet (RoCE), and one host's loopback under Gloo.
const std::map<std::string, Link> &links();

/// Where a world size's collectives run: within one host up to `ranksPerHost` ranks (the
/// intra-host link), across hosts beyond; `alphaUs` and `bandwidthGBps` override both links.
struct Topology {
  std::string link = "ib", intraLink = "nvlink";
  int64_t ranksPerHost = 8;
  std::optional<double> alphaUs, bandwidthGBps;
  /// Whether a topology option was given.
  bool given = false;
  /// The link an all-reduce over `ranks` is bound by.
  Link linkFor(int64_t ranks) const;
};

/// Reads one topology option's value into `t` (flag: --link, --intra-link, --ranks-per-host,
/// --alpha-us or --bandwidth-gbps); a bad value throws OptionError.
void setTopology(const std::string &flag, const std::string &value, Topology &t);

/// The topology options, for a command whose target holds a Topology at `get(target)`.
template <typename Target> std::vector<Option<Target>> topologyOptions(Topology &(*get)(Target &)) {
  auto set = [get](const std::string &f, const std::string &v, Target &t) {
    setTopology(f, v, get(t));
  };
  return {
      {"--link", "nvlink|ib|ethernet|loopback", "the link between hosts (default ib)", set},
      {"--intra-link", "NAME", "the link within a host (default nvlink)", set},
      {"--ranks-per-host", "N", "ranks sharing a host (default 8): larger rings cross hosts", set},
      {"--alpha-us", "A", "latency per ring step instead of the links' (both)", set},
      {"--bandwidth-gbps", "B", "bus bandwidth in GB/s instead of the links' (both)", set},
  };
}

/// An all-reduce of `bytes` over `ranks`: the faster of a ring, 2(N-1) alpha + 2(N-1)/N B /
/// beta, and a double binary tree, 2 ceil(log2 N) alpha + 2 B / beta (NCCL chooses the same
/// way); 0 for one rank.
double allReduceSeconds(int64_t bytes, int64_t ranks, const Link &link);

/// A bucket to reduce: its bytes and when its last gradient is ready (seconds into the phase).
struct ReadyBucket {
  int64_t bytes = 0;
  double ready = 0;
};

/// A ring reduce-scatter or all-gather of a `bytes` buffer over `ranks`, half an
/// all-reduce's ring: (N-1) alpha + (N-1)/N B / beta; 0 for one rank.
double halfRingSeconds(int64_t bytes, int64_t ranks, const Link &link);

/// One run of a phase, in seconds from its start.
struct PhaseRun {
  double end = 0;     // done: its optimizer step and, sharded, its all-gathers
  double exposed = 0; // communication hidden behind neither backward nor the optimizer
};

/// A phase at `ranks` ranks: forward and backward take `compute`, `buckets` (in launch order)
/// are reduced one at a time on one channel, each once it is ready and the one before it is
/// done, then the optimizer steps (`optimizer`, measured unsharded). Sharded (`zeroStage` 1
/// or 2, more than one rank), as the runtime does it: stage 2 reduce-scatters instead of
/// all-reducing; each rank steps its 1/ranks of every bucket (that share of the optimizer's
/// time, by bytes), bucket by bucket in launch order, and all-gathers each bucket once it is
/// stepped, the gathers one at a time. `slowdown` stretches compute and optimizer (CPU ranks
/// sharing cores).
PhaseRun simulatePhase(const std::vector<ReadyBucket> &buckets, double compute, double optimizer,
                       int64_t ranks, const Link &link, int zeroStage = 0, double slowdown = 1.0);

} // namespace ganc::perf
