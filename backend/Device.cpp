// StagedBatch and the noise generator, for CPU and (when built with it) CUDA.
#include "backend/Device.h"

#ifdef GANC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

namespace ganc::backend {

struct StagedBatch::Ring {
#ifdef GANC_WITH_CUDA
  static constexpr int kSlots = 4;
  std::vector<at::Tensor> pinned;
  std::vector<at::cuda::CUDAEvent> copied; // the transfer out of each pinned buffer is done
  int next = 0;
  std::optional<at::cuda::CUDAStream> copyStream; // none: the copies run on the compute stream
  at::Tensor landing;                             // on the device, in the pinned buffers' layout
  at::cuda::CUDAEvent landed;                     // the last transfer into `landing` is done
  at::cuda::CUDAEvent consumed; // the last batch in `landing` has moved into place
#endif
};

StagedBatch::StagedBatch(std::vector<int64_t> shape, c10::ScalarType dtype, c10::Device device,
                         bool channelsLast, bool copyStream) {
  if (!device.is_cuda())
    return;
#ifdef GANC_WITH_CUDA
  auto format = channelsLast && shape.size() == 4 ? at::MemoryFormat::ChannelsLast
                                                  : at::MemoryFormat::Contiguous;
  device_ = torch::empty(shape, at::TensorOptions(device).dtype(dtype).memory_format(format));
  ring_ = std::make_unique<Ring>();
  if (copyStream) {
    ring_->landing = torch::empty(shape, at::TensorOptions(device).dtype(dtype));
    ring_->copyStream = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  }
  for (int i = 0; i < Ring::kSlots; ++i) {
    ring_->pinned.push_back(torch::empty(shape, at::TensorOptions(dtype).pinned_memory(true)));
    ring_->copied.emplace_back();
  }
#endif
}

StagedBatch::~StagedBatch() = default;

void StagedBatch::stage(const at::Tensor &source, const at::Tensor &indices) {
  if (!ring_) {
    device_ = source.index_select(0, indices);
    return;
  }
#ifdef GANC_WITH_CUDA
  Ring &r = *ring_;
  const int slot = r.next;
  r.next = (slot + 1) % Ring::kSlots;
  // Waits only if the transfer out of this buffer, four batches ago, is somehow still pending.
  r.copied[slot].synchronize();
  at::index_select_out(r.pinned[slot], source, 0, indices);
  const at::cuda::CUDAStream compute = at::cuda::getCurrentCUDAStream();
  if (!r.copyStream) { // in order on the compute stream, straight into place
    device_.copy_(r.pinned[slot], /*non_blocking=*/true);
    r.copied[slot].record(compute);
    return;
  }
  // The landing buffer is refilled once the compute stream has moved its last batch out; the
  // transfer then runs beside whatever the compute stream still has queued.
  r.consumed.block(*r.copyStream);
  {
    c10::cuda::CUDAStreamGuard guard(*r.copyStream);
    r.landing.copy_(r.pinned[slot], /*non_blocking=*/true);
  }
  r.copied[slot].record(*r.copyStream);
  r.landed.record(*r.copyStream);
  // In stream order after the queued phases that read the previous batch at this address.
  r.landed.block(compute);
  device_.copy_(r.landing, /*non_blocking=*/true);
  r.consumed.record(compute);
#endif
}

struct PhaseTimer::Events {
#ifdef GANC_WITH_CUDA
  struct Pair {
    at::cuda::CUDAEvent start{cudaEventDefault};
    at::cuda::CUDAEvent end{cudaEventDefault};
    size_t index = 0;
  };
  std::deque<std::unique_ptr<Pair>> pending;
  std::vector<std::unique_ptr<Pair>> free; // recorded pairs are reused, never re-created
  std::unique_ptr<Pair> open;
#endif
};

PhaseTimer::PhaseTimer(c10::Device device) : events_(std::make_unique<Events>()) {
#ifdef GANC_WITH_CUDA
  onDevice_ = device.is_cuda();
#endif
}

PhaseTimer::~PhaseTimer() = default;

void PhaseTimer::begin() {
#ifdef GANC_WITH_CUDA
  if (!onDevice_)
    return;
  if (events_->free.empty()) {
    events_->open = std::make_unique<Events::Pair>();
  } else {
    events_->open = std::move(events_->free.back());
    events_->free.pop_back();
  }
  events_->open->start.record(at::cuda::getCurrentCUDAStream());
#endif
}

void PhaseTimer::end(size_t index) {
#ifdef GANC_WITH_CUDA
  if (!onDevice_ || !events_->open)
    return;
  events_->open->end.record(at::cuda::getCurrentCUDAStream());
  events_->open->index = index;
  events_->pending.push_back(std::move(events_->open));
  collect(false);
#endif
}

void PhaseTimer::collect(bool wait) {
#ifdef GANC_WITH_CUDA
  while (!events_->pending.empty()) {
    Events::Pair &pair = *events_->pending.front();
    if (wait)
      pair.end.synchronize();
    else if (!pair.end.query())
      return;
    if (seconds_.size() <= pair.index)
      seconds_.resize(pair.index + 1, 0.0);
    seconds_[pair.index] += pair.start.elapsed_time(pair.end) / 1000.0;
    events_->free.push_back(std::move(events_->pending.front()));
    events_->pending.pop_front();
  }
#endif
}

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// CPU with CUDA, as torch.profiler's default: the eager loops' figures are taken this way.
const std::set<ActivityType> kActivities = {ActivityType::CPU, ActivityType::CUDA};

void synchronizeDevice() {
#ifdef GANC_WITH_CUDA
  C10_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

} // namespace

KernelTrace::KernelTrace() {
#ifndef GANC_WITH_CUDA
  throw std::runtime_error("this ganc was built without CUDA");
#endif
}

KernelTrace::~KernelTrace() {
  if (running_)
    profiler::disableProfiler();
}

void KernelTrace::start() {
  // Prepared here, not earlier: a prepared profiler already has CUPTI record every kernel
  // (and discards the records), which would slow the steps before the window.
  profiler::prepareProfiler(ProfilerConfig(ProfilerState::KINETO), kActivities);
  profiler::enableProfiler(ProfilerConfig(ProfilerState::KINETO), kActivities);
  running_ = true;
  synchronizeDevice();
  start_ = std::chrono::steady_clock::now();
}

KernelTrace::Result KernelTrace::stop(const std::string &traceFile) {
  synchronizeDevice();
  Result result;
  result.wallSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  running_ = false;
  std::unique_ptr<profiler::ProfilerResult> trace = profiler::disableProfiler();
  std::vector<std::pair<double, double>> intervals;
  std::map<std::string, Activity> byName;
  for (const profiler::KinetoEvent &event : trace->events()) {
    if (event.deviceType() != c10::DeviceType::CUDA)
      continue;
    intervals.emplace_back(static_cast<double>(event.startNs()),
                           static_cast<double>(event.endNs()));
    Activity &a = byName[event.name()];
    a.calls += 1;
    a.seconds += static_cast<double>(event.endNs() - event.startNs()) / 1e9;
  }
  result.activities = static_cast<int64_t>(intervals.size());
  std::vector<double> edgesNs;
  for (double edge : kGapEdgesSeconds)
    edgesNs.push_back(edge * 1e9);
  result.gaps = idleGaps(intervals, edgesNs);
  for (Gaps &g : result.gaps)
    g.length /= 1e9;
  result.busySeconds = unionLength(std::move(intervals)) / 1e9;
  for (auto &[name, a] : byName) {
    a.name = name;
    result.top.push_back(std::move(a));
  }
  std::sort(result.top.begin(), result.top.end(),
            [](const Activity &x, const Activity &y) { return x.seconds > y.seconds; });
  if (result.top.size() > kTop)
    result.top.resize(kTop);
  if (!traceFile.empty()) {
    try {
      trace->save(traceFile);
    } catch (const std::exception &e) {
      result.traceError = e.what();
    }
    if (result.traceError.empty() && !std::ifstream(traceFile))
      result.traceError = "cannot write " + traceFile;
  }
  return result;
}

const std::vector<double> KernelTrace::kGapEdgesSeconds = {2e-6, 10e-6, 100e-6};

std::vector<KernelTrace::Gaps>
KernelTrace::idleGaps(std::vector<std::pair<double, double>> intervals,
                      const std::vector<double> &edges) {
  std::vector<Gaps> buckets(edges.size() + 1);
  std::sort(intervals.begin(), intervals.end());
  bool started = false;
  double end = 0;
  for (const auto &[a, b] : intervals) {
    if (b <= a)
      continue; // empty: covers nothing
    if (started && a > end) {
      const double gap = a - end;
      const size_t i =
          static_cast<size_t>(std::upper_bound(edges.begin(), edges.end(), gap) - edges.begin());
      buckets[i].count += 1;
      buckets[i].length += gap;
    }
    end = started ? std::max(end, b) : b;
    started = true;
  }
  return buckets;
}

double KernelTrace::unionLength(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0, end = -std::numeric_limits<double>::infinity();
  for (const auto &[a, b] : intervals) {
    const double from = std::max(a, end);
    if (b > from)
      total += b - from;
    end = std::max(end, b);
  }
  return total;
}

bool toChannelsLast(torch::jit::Module &module) {
  torch::NoGradGuard noGrad;
  bool any = false;
  auto convert = [&](at::Tensor t) {
    if (t.dim() != 4)
      return;
    t.set_data(t.contiguous(at::MemoryFormat::ChannelsLast));
    any = true;
  };
  for (const auto &p : module.named_parameters(/*recurse=*/true))
    convert(p.value);
  for (const auto &b : module.named_buffers(/*recurse=*/true))
    convert(b.value);
  return any;
}

at::Generator noiseGenerator(c10::Device device, uint64_t seed) {
#ifdef GANC_WITH_CUDA
  if (device.is_cuda()) {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
    return gen;
  }
#endif
  return at::detail::createCPUGenerator(seed);
}

at::Generator phaseGenerator(c10::Device device, uint64_t seed) {
  if (device.is_cuda())
    return noiseGenerator(device, seed);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
  return gen;
}

ForkedRng::ForkedRng(c10::Device device) : cpu_(at::detail::getDefaultCPUGenerator()) {
  cpuState_ = cpu_.get_state();
#ifdef GANC_WITH_CUDA
  if (device.is_cuda()) {
    device_ = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    deviceState_ = device_.get_state();
  }
#endif
}

ForkedRng::~ForkedRng() {
  cpu_.set_state(cpuState_);
  if (device_.defined())
    device_.set_state(deviceState_);
}

} // namespace ganc::backend
