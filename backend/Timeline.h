// Marks in one run of a phase, read back as seconds from its start: what `ganc train
// --profile` records and `ganc simulate` predicts other world sizes from.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace ganc::backend {

/// The points of one phase run: its start, the end of its last backward, the optimizer
/// step's start and end, when each bucket's gradients were written into it (its last one
/// ready) and when each used parameter's gradient was ready. The executor and the reducer mark them
/// as they issue the run; what a mark means is the device's: on the CPU, the host clock when it is
/// made; on a GPU, when the device reaches that point of its stream (a CUDA event, recorded into
/// the graph when the phase is captured, so every replay records it again).
class RunTimeline {
public:
  enum Fixed : size_t { Start, BackwardEnd, StepStart, StepEnd, FixedPoints };

  RunTimeline(size_t buckets, size_t parameters) : buckets_(buckets), parameters_(parameters) {}
  virtual ~RunTimeline() = default;
  RunTimeline(const RunTimeline &) = delete;
  RunTimeline &operator=(const RunTimeline &) = delete;

  size_t bucket(size_t b) const { return FixedPoints + b; }
  size_t parameter(size_t i) const { return FixedPoints + buckets_ + i; }
  size_t buckets() const { return buckets_; }
  size_t parameters() const { return parameters_; }
  size_t size() const { return FixedPoints + buckets_ + parameters_; }

  virtual void mark(size_t point) = 0;
  /// Seconds from the start to every point of the last run, by point (on a GPU this waits
  /// until the device has passed the last of them).
  virtual std::vector<double> read() = 0;

private:
  size_t buckets_, parameters_;
};

/// The host clock's timeline (CPU ranks: the work is done when the host gets there).
class HostTimeline : public RunTimeline {
public:
  HostTimeline(size_t buckets, size_t parameters)
      : RunTimeline(buckets, parameters), marks_(size()) {}
  void mark(size_t point) override { marks_[point] = std::chrono::steady_clock::now(); }
  std::vector<double> read() override {
    std::vector<double> seconds;
    seconds.reserve(marks_.size());
    for (const auto &m : marks_)
      seconds.push_back(std::chrono::duration<double>(m - marks_[Start]).count());
    return seconds;
  }

private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

/// Makes a phase's timeline for its bucket and used-parameter counts.
using TimelineFactory =
    std::function<std::unique_ptr<RunTimeline>(size_t buckets, size_t parameters)>;

} // namespace ganc::backend
