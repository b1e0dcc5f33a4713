// The device-side measurements' arithmetic (--kernel-time): how long a set of possibly
// overlapping GPU activities kept the GPU busy, and the idle gaps between them by length,
// against a grid counted cell by cell.
#include "backend/Device.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

using ganc::backend::KernelTrace;

namespace {

/// Grid cells [t, t + 1) covered by at least one interval: the union's length, by brute force.
int coveredCells(const std::vector<std::pair<double, double>> &intervals, int horizon) {
  int covered = 0;
  for (int t = 0; t < horizon; ++t)
    for (const auto &[a, b] : intervals)
      if (a <= t && t + 1 <= b) {
        ++covered;
        break;
      }
  return covered;
}

/// Up to 12 intervals with whole-number ends in [0, horizon], empty ones among them.
std::vector<std::pair<double, double>> randomIntervals(std::mt19937 &rng, int horizon) {
  std::uniform_int_distribution<int> point(0, horizon), count(0, 12);
  std::vector<std::pair<double, double>> intervals;
  for (int i = count(rng); i > 0; --i) {
    int a = point(rng), b = point(rng);
    intervals.emplace_back(std::min(a, b), std::max(a, b));
  }
  return intervals;
}

} // namespace

TEST(KernelTrace, UnionLengthCountsOverlapsOnce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int horizon = 64;
    std::vector<std::pair<double, double>> intervals = randomIntervals(rng, horizon);
    EXPECT_EQ(KernelTrace::unionLength(intervals), coveredCells(intervals, horizon))
        << "trial " << trial;
  }
}

TEST(KernelTrace, UnionLengthOfNothingIsZero) { EXPECT_EQ(KernelTrace::unionLength({}), 0.0); }

TEST(KernelTrace, IdleGapsAreTheHolesBetweenTheUnionsPieces) {
  std::mt19937 rng(11);
  const std::vector<double> edges = {2, 5, 20};
  for (int trial = 0; trial < 500; ++trial) {
    const int horizon = 64;
    std::vector<std::pair<double, double>> intervals = randomIntervals(rng, horizon);
    // By brute force: the runs of uncovered cells between the first and the last covered one.
    std::vector<bool> covered(horizon, false);
    for (const auto &[a, b] : intervals)
      for (int t = static_cast<int>(a); t < static_cast<int>(b); ++t)
        covered[t] = true;
    std::vector<int> counts(edges.size() + 1, 0), lengths(edges.size() + 1, 0);
    int first = -1, last = -1;
    for (int t = 0; t < horizon; ++t)
      if (covered[t]) {
        first = first < 0 ? t : first;
        last = t;
      }
    for (int t = first; first >= 0 && t <= last;) {
      int run = 0;
      while (t <= last && !covered[t]) {
        ++run;
        ++t;
      }
      if (run > 0) {
        size_t bucket = 0;
        while (bucket < edges.size() && run >= edges[bucket])
          ++bucket;
        counts[bucket] += 1;
        lengths[bucket] += run;
      }
      while (t <= last && covered[t])
        ++t;
    }
    std::vector<KernelTrace::Gaps> got = KernelTrace::idleGaps(intervals, edges);
    ASSERT_EQ(got.size(), edges.size() + 1);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].count, counts[i]) << "trial " << trial << ", bucket " << i;
      EXPECT_EQ(got[i].length, lengths[i]) << "trial " << trial << ", bucket " << i;
    }
  }
}
