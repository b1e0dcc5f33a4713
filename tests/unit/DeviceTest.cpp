// The device-side measurements' arithmetic (--kernel-time): how long a set of possibly
// overlapping GPU activities kept the GPU busy, and the idle gaps between them by length,
// against a grid counted cell by cell. And the fill kernel's plan for a memset node (the
// memset-to-kernel pass), against cudaMemset2D's definition written out element by element.
#include "backend/Device.h"
#include "backend/FillPlan.h"

#include <gtest/gtest.h>

#include <cstring>
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

namespace {

/// cudaMemset2D's definition: each of `width` elements of `elementSize` bytes in each of
/// `height` rows `pitch` bytes apart holds the low bytes of `value` (little-endian).
void memsetReference(char *dst, size_t pitch, unsigned value, unsigned elementSize, size_t width,
                     size_t height) {
  for (size_t row = 0; row < height; ++row)
    for (size_t i = 0; i < width; ++i)
      for (unsigned b = 0; b < elementSize; ++b)
        dst[row * pitch + i * elementSize + b] = static_cast<char>((value >> (8 * b)) & 0xff);
}

} // namespace

TEST(FillPlan, WritesWhatTheMemsetWrites) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> offset(0, 7), width(1, 40), height(1, 4), slack(0, 9);
  std::uniform_int_distribution<uint32_t> value;
  const unsigned sizes[] = {1, 2, 4};
  int wide = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const unsigned size = sizes[trial % 3];
    const size_t w = width(rng), h = height(rng);
    // A pitch of whole elements, at least a row (CUDA asks no more of a 2-D memset).
    const size_t pitch = (w + slack(rng)) * size;
    const uint32_t v = value(rng);
    alignas(16) char got[1024], want[1024];
    std::memset(got, 0xAB, sizeof got);
    std::memset(want, 0xAB, sizeof want);
    const size_t at = offset(rng) * size; // element-aligned, as a device pointer of that type is
    ASSERT_LE(at + (h - 1) * pitch + w * size, sizeof got);
    memsetReference(want + at, pitch, v, size, w, h);
    const auto plan =
        ganc::backend::planFill(reinterpret_cast<uintptr_t>(got + at), pitch, v, size, w, h);
    ASSERT_TRUE(plan.has_value());
    ganc::backend::fillOnHost(got + at, *plan);
    ASSERT_EQ(0, std::memcmp(got, want, sizeof got))
        << "element size " << size << ", width " << w << ", height " << h << ", pitch " << pitch
        << ", offset " << at << ", value " << v << ": written as " << plan->wordBytes
        << "-byte words";
    wide += plan->wordBytes == 4 && size < 4;
  }
  EXPECT_GT(wide, 100); // the widened path (bytes and halves written four bytes at a time) ran
}

TEST(FillPlan, WidensAlignedRowsAndRefusesWhatCudaWouldNot) {
  alignas(4) static char buffer[64];
  const auto base = reinterpret_cast<uintptr_t>(buffer);
  // PyTorch's reduction semaphores: cudaMemsetAsync(ptr, 0, 16), one row of 16 bytes.
  auto plan = ganc::backend::planFill(base, 0, 0, 1, 16, 1);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->wordBytes, 4u);
  EXPECT_EQ(plan->width, 4u);
  EXPECT_EQ(plan->word, 0u);
  // A byte value repeated in every byte of the word; a half in both halves.
  EXPECT_EQ(ganc::backend::planFill(base, 0, 0x1ff, 1, 8, 1)->word, 0xffffffffu);
  EXPECT_EQ(ganc::backend::planFill(base, 0, 0x12345, 2, 2, 1)->word, 0x23452345u);
  // An unaligned start or a row that ends mid-word keeps the element's own size.
  EXPECT_EQ(ganc::backend::planFill(base + 1, 0, 7, 1, 8, 1)->wordBytes, 1u);
  EXPECT_EQ(ganc::backend::planFill(base, 0, 7, 2, 3, 1)->wordBytes, 2u);
  EXPECT_EQ(ganc::backend::planFill(base, 6, 7, 2, 2, 2)->wordBytes, 2u); // pitch 6
  // Nothing to write, or an element size cudaMemset has not: no plan (the node stays).
  EXPECT_FALSE(ganc::backend::planFill(base, 0, 0, 1, 0, 1));
  EXPECT_FALSE(ganc::backend::planFill(base, 0, 0, 1, 4, 0));
  EXPECT_FALSE(ganc::backend::planFill(base, 0, 0, 3, 4, 1));
  EXPECT_FALSE(ganc::backend::planFill(base, 0, 0, 8, 4, 1));
}

TEST(CopyPlan, CopiesWhatTheCopyNodeCopies) {
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> offset(0, 31), width(1, 70), height(1, 4), slack(0, 20);
  std::uniform_int_distribution<int> byte(0, 255);
  int wordSizes[17] = {};
  for (int trial = 0; trial < 3000; ++trial) {
    // Often rows of whole 16-byte words, as a float tensor's usually are.
    const size_t w = trial % 4 == 1 ? 16 * (1 + width(rng) % 4) : width(rng), h = height(rng);
    // Pitches of at least a row (as cudaMemcpy2D asks), often multiples of 16.
    const size_t srcPitch = trial % 2 ? (w + 15) / 16 * 16 : w + slack(rng);
    const size_t dstPitch = trial % 3 ? (w + 15) / 16 * 16 : w + slack(rng);
    const size_t srcAt = trial % 2 ? offset(rng) / 16 * 16 : offset(rng);
    const size_t dstAt = trial % 2 ? offset(rng) / 16 * 16 : offset(rng);
    alignas(16) char src[512], got[512], want[512];
    for (char &c : src)
      c = static_cast<char>(byte(rng));
    std::memset(got, 0xAB, sizeof got);
    std::memset(want, 0xAB, sizeof want);
    ASSERT_LE(srcAt + (h - 1) * srcPitch + w, sizeof src);
    ASSERT_LE(dstAt + (h - 1) * dstPitch + w, sizeof got);
    for (size_t row = 0; row < h; ++row) // cudaMemcpy2D's definition
      std::memcpy(want + dstAt + row * dstPitch, src + srcAt + row * srcPitch, w);
    const auto plan =
        ganc::backend::planCopy(reinterpret_cast<uintptr_t>(got + dstAt), dstPitch,
                                reinterpret_cast<uintptr_t>(src + srcAt), srcPitch, w, h);
    ASSERT_TRUE(plan.has_value());
    ganc::backend::copyOnHost(got + dstAt, src + srcAt, *plan);
    ASSERT_EQ(0, std::memcmp(got, want, sizeof got))
        << "width " << w << ", height " << h << ", pitches " << srcPitch << " and " << dstPitch
        << ", offsets " << srcAt << " and " << dstAt << ": copied as " << plan->wordBytes
        << "-byte words";
    ++wordSizes[plan->wordBytes];
  }
  // Every word size ran, the 16-byte one (aligned tensors) often.
  EXPECT_GT(wordSizes[16], 100);
  EXPECT_GT(wordSizes[4], 0);
  EXPECT_GT(wordSizes[2], 0);
  EXPECT_GT(wordSizes[1], 100);
}

TEST(CopyPlan, WidensToWhatEveryAddressAllows) {
  alignas(16) static char buffer[256];
  const auto base = reinterpret_cast<uintptr_t>(buffer);
  // A float32 loss copied out of a phase graph: one row of 4 bytes.
  auto plan = ganc::backend::planCopy(base, 0, base + 64, 0, 4, 1);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->wordBytes, 4u);
  EXPECT_EQ(plan->width, 1u);
  EXPECT_EQ(ganc::backend::planCopy(base, 0, base + 64, 0, 96, 1)->wordBytes, 16u);
  EXPECT_EQ(ganc::backend::planCopy(base, 0, base + 68, 0, 96, 1)->wordBytes, 4u);   // source
  EXPECT_EQ(ganc::backend::planCopy(base, 0, base + 64, 0, 94, 1)->wordBytes, 2u);   // width
  EXPECT_EQ(ganc::backend::planCopy(base, 24, base + 64, 32, 16, 2)->wordBytes, 4u); // pitch 24
  // One row: its pitches do not matter.
  EXPECT_EQ(ganc::backend::planCopy(base, 3, base + 64, 5, 32, 1)->wordBytes, 16u);
  EXPECT_FALSE(ganc::backend::planCopy(base, 0, base + 64, 0, 0, 1));
  EXPECT_FALSE(ganc::backend::planCopy(base, 0, base + 64, 0, 4, 0));
}
