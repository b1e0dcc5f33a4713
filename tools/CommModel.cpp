// The alpha-beta communication model.
#include "tools/CommModel.h"

#include <algorithm>
#include <cmath>

namespace ganc::tools {

const std::map<std::string, Link> &links() {
  static const std::map<std::string, Link> known = {{"nvlink", {5e-6, 300e9}},
                                                    {"ib", {10e-6, 40e9}},
                                                    {"ethernet", {30e-6, 10e9}},
                                                    {"loopback", {50e-6, 2e9}}};
  return known;
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

double lastReduceEnd(const std::vector<ReadyBucket> &buckets, int64_t ranks, const Link &link,
                     double slowdown) {
  double end = 0;
  for (const ReadyBucket &b : buckets)
    end = std::max(b.ready * slowdown, end) + allReduceSeconds(b.bytes, ranks, link);
  return end;
}

} // namespace ganc::tools
