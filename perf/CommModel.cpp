// The alpha-beta communication model.
#include "perf/CommModel.h"

#include "support/TextFormat.h"

#include <algorithm>
#include <cmath>

namespace ganc::perf {

const std::map<std::string, Link> &links() {
  static const std::map<std::string, Link> known = {{"nvlink", {5e-6, 300e9}},
                                                    {"ib", {10e-6, 40e9}},
                                                    {"ethernet", {30e-6, 10e9}},
                                                    {"loopback", {50e-6, 2e9}}};
  return known;
}

Link Topology::linkFor(int64_t ranks) const {
  Link chosen = links().at(ranks <= ranksPerHost ? intraLink : link);
  if (alphaUs)
    chosen.alpha = *alphaUs * 1e-6;
  if (bandwidthGBps)
    chosen.bandwidth = *bandwidthGBps * 1e9;
  return chosen;
}

void setTopology(const std::string &flag, const std::string &value, Topology &t) {
  t.given = true;
  if (flag == "--link" || flag == "--intra-link") {
    if (!links().count(value))
      throw OptionError(flag + " takes nvlink, ib, ethernet or loopback, not '" + value + "'");
    (flag == "--link" ? t.link : t.intraLink) = value;
  } else if (flag == "--ranks-per-host") {
    const std::optional<int64_t> n = parseInt64(value);
    if (!n || *n < 1)
      throw OptionError(flag + " takes a positive integer, not '" + value + "'");
    t.ranksPerHost = *n;
  } else {
    (flag == "--alpha-us" ? t.alphaUs : t.bandwidthGBps) = positive(flag, value);
  }
}

double allReduceSeconds(int64_t bytes, int64_t ranks, const Link &link) {
  if (ranks <= 1)
    return 0;
  const double n = static_cast<double>(ranks);
  const double b = static_cast<double>(bytes) / link.bandwidth;
  const double ring = 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * b;
  const double tree = 2 * std::ceil(std::log2(n)) * link.alpha + 2 * b;
  return std::min(ring, tree);
}

double halfRingSeconds(int64_t bytes, int64_t ranks, const Link &link) {
  if (ranks <= 1)
    return 0;
  const double n = static_cast<double>(ranks);
  return (n - 1) * link.alpha + (n - 1) / n * static_cast<double>(bytes) / link.bandwidth;
}

PhaseRun simulatePhase(const std::vector<ReadyBucket> &buckets, double compute, double optimizer,
                       int64_t ranks, const Link &link, int zeroStage, double slowdown) {
  compute *= slowdown;
  optimizer *= slowdown;
  const bool sharded = zeroStage > 0 && ranks > 1;
  double reduced = 0; // when the last bucket's collective ends
  int64_t total = 0;
  for (const ReadyBucket &b : buckets) {
    const double collective = zeroStage == 2 && sharded ? halfRingSeconds(b.bytes, ranks, link)
                                                        : allReduceSeconds(b.bytes, ranks, link);
    reduced = std::max(b.ready * slowdown, reduced) + collective;
    total += b.bytes;
  }
  const double stepStart = std::max(compute, reduced);
  PhaseRun run;
  if (!sharded || total == 0) {
    run.end = stepStart + optimizer;
    run.exposed = stepStart - compute;
    return run;
  }
  double stepped = stepStart, gathered = 0;
  for (const ReadyBucket &b : buckets) {
    stepped += optimizer / static_cast<double>(ranks) * static_cast<double>(b.bytes) /
               static_cast<double>(total);
    gathered = std::max(stepped, gathered) + halfRingSeconds(b.bytes, ranks, link);
  }
  run.end = std::max(stepped, gathered);
  run.exposed = run.end - compute - optimizer / static_cast<double>(ranks);
  return run;
}

} // namespace ganc::perf
