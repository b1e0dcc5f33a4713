// The device-side measurements' arithmetic: how long a set of possibly overlapping GPU
// activities kept the GPU busy (--kernel-time), against counting a fine grid point by point.
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

} // namespace

TEST(KernelTrace, UnionLengthCountsOverlapsOnce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int horizon = 64;
    std::uniform_int_distribution<int> point(0, horizon), count(0, 12);
    std::vector<std::pair<double, double>> intervals;
    for (int i = count(rng); i > 0; --i) {
      int a = point(rng), b = point(rng);
      intervals.emplace_back(std::min(a, b), std::max(a, b)); // empty ones too
    }
    EXPECT_EQ(KernelTrace::unionLength(intervals), coveredCells(intervals, horizon))
        << "trial " << trial;
  }
}

TEST(KernelTrace, UnionLengthOfNothingIsZero) { EXPECT_EQ(KernelTrace::unionLength({}), 0.0); }
