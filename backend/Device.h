// Per-device input plumbing: the step's batch in a static device buffer, and the generator
// that phase noise is drawn from.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ganc::backend {

namespace gpu {
class BatchRing;
class EventTimer;
} // namespace gpu

/// The step's data batch at a fixed device address (a captured graph reads it there). On
/// CUDA, `stage` gathers the batch into one of a ring of pinned host buffers and copies it
/// to the device on a copy stream of its own, into a landing buffer; the compute stream then
/// waits for that copy and moves the batch into place (a device copy, which also converts it
/// to channels-last). So the host-to-device transfer overlaps the GPU work of the steps still
/// queued ahead of it instead of holding the compute stream, and refilling a host buffer
/// never waits for the GPU to finish the previous step. On CPU it just holds the batch.
class StagedBatch {
public:
  /// `channelsLast`: the device buffer of a 4-D batch is NHWC (the model's layout).
  /// `copyStream`: on CUDA the host-to-device copy runs on a stream of its own, beside the
  /// compute stream's queued work (otherwise on the compute stream, in order).
  StagedBatch(std::vector<int64_t> shape, c10::ScalarType dtype, c10::Device device,
              bool channelsLast = false, bool copyStream = true);
  ~StagedBatch();
  /// Stages `source`'s samples `indices` (a host tensor and index list) as the batch.
  void stage(const at::Tensor &source, const at::Tensor &indices);
  const at::Tensor &tensor() const { return device_; }

private:
  at::Tensor device_;
  std::unique_ptr<gpu::BatchRing> ring_; // on a GPU
};

/// The device time of the phases each step runs, measured without making the host wait: on
/// CUDA an event pair is recorded around every phase launch and read once the GPU has passed
/// it. On CPU there is nothing to time here (`onDevice()` is false): the executor's own
/// clock measures the work there.
class PhaseTimer {
public:
  explicit PhaseTimer(c10::Device device);
  ~PhaseTimer();
  bool onDevice() const { return events_ != nullptr; }
  /// Before a phase is launched, on the stream it runs on.
  void begin();
  /// After it was launched: its device time counts towards `index` (the caller's numbering of
  /// the phase runs it times, 0-based).
  void end(size_t index);
  /// Adds up the pairs the device has passed; with `wait`, waits for all of them first.
  void collect(bool wait);
  /// Device seconds per index, of the pairs collected so far.
  const std::vector<double> &seconds() const { return seconds_; }

private:
  std::unique_ptr<gpu::EventTimer> events_; // on a GPU
  std::vector<double> seconds_;
};

/// --kernel-time: the CUDA profiler (CUPTI, through LibTorch's Kineto profiler) over a window
/// of steps, for how long the GPU ran anything (kernels, copies, memsets; work overlapping on
/// two streams counts once) against the window's wall time: the busy fraction torch.profiler
/// gives an eager loop, measured the same way for captured graphs.
class KernelTrace {
public:
  /// Idle gaps of one length range: how many, how long in all.
  struct Gaps {
    int64_t count = 0;
    double length = 0;
  };
  /// The GPU activities of one name (a kernel, "Memcpy DtoD", ...): how many, how long.
  struct Activity {
    std::string name;
    int64_t calls = 0;
    double seconds = 0;
  };
  struct Result {
    double wallSeconds = 0;    // from a synchronised start to a synchronised stop
    double busySeconds = 0;    // the union of the GPU activities' intervals
    int64_t activities = 0;    // kernels, copies and memsets recorded
    std::vector<Activity> top; // by total time, the longest first (at most kTop)
    std::string traceError;    // why the trace file was not written, if it was asked for
    std::vector<Gaps> gaps;    // the GPU's idle gaps (seconds) by kGapEdgesSeconds
  };
  static constexpr size_t kTop = 25;
  /// Idle gaps shorter than 2 us (back-to-back kernels), 10 us, 100 us, and longer: many
  /// short ones are launch latency inside a graph, long ones a GPU waiting for the host.
  static const std::vector<double> kGapEdgesSeconds;
  /// Throws where ganc was built without CUDA.
  KernelTrace();
  ~KernelTrace();
  /// Starts tracing, waits for the GPU, starts the clock (the profiler's start-up cost stays
  /// outside the window).
  void start();
  /// Waits for the GPU, stops tracing and the clock; writes the trace to `traceFile` (Chrome
  /// trace JSON) unless it is empty.
  Result stop(const std::string &traceFile = "");
  bool running() const { return running_; }
  /// The length of the union of [start, end) intervals (any unit).
  static double unionLength(std::vector<std::pair<double, double>> intervals);
  /// The idle gaps between the union's pieces (from the first start to the last end), by
  /// length: bucket i holds the gaps shorter than edges[i] (and not shorter than the edge
  /// before), the last bucket those of edges.back() and longer.
  static std::vector<Gaps> idleGaps(std::vector<std::pair<double, double>> intervals,
                                    const std::vector<double> &edges);

private:
  bool running_ = false;
  std::chrono::steady_clock::time_point start_;
};

/// Converts every 4-D parameter and buffer of `module` to the channels-last (NHWC) layout in
/// place (tensor identities are kept), as `nn.Module.to(memory_format=torch.channels_last)`
/// does. Returns whether the module has any such tensor.
bool toChannelsLast(torch::jit::Module &module);

/// The generator phase noise comes from, seeded with `seed`: a private CPU generator on CPU,
/// the default CUDA generator on GPUs (the one CUDA Graph capture keeps graph-safe).
at::Generator noiseGenerator(c10::Device device, uint64_t seed);

/// What random ops inside a phase method (dropout, randn_like, augmentation) draw from: the
/// device's default generator. On CUDA that is the noise generator itself (graph-safe, seeded
/// by noiseGenerator); on CPU the default CPU generator, seeded here with `seed`.
at::Generator phaseGenerator(c10::Device device, uint64_t seed);

/// The default generator of `device`, whose state a scope saves and restores (like
/// torch.random.fork_rng), so that work outside training (sample grids) draws nothing from
/// the training streams.
class ForkedRng {
public:
  explicit ForkedRng(c10::Device device);
  ~ForkedRng();
  ForkedRng(const ForkedRng &) = delete;
  ForkedRng &operator=(const ForkedRng &) = delete;

private:
  at::Generator cpu_, device_;
  at::Tensor cpuState_, deviceState_;
};

} // namespace ganc::backend
