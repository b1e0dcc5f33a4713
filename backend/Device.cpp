// StagedBatch and the noise generator, for CPU and GPUs (the GPU parts behind GpuHooks.h).
#include "backend/Device.h"

#include "backend/GpuHooks.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>

namespace ganc::backend {

StagedBatch::StagedBatch(std::vector<int64_t> shape, c10::ScalarType dtype, c10::Device device,
                         bool channelsLast, bool copyStream) {
  if (!device.is_cuda())
    return;
  ring_ = gpu::makeBatchRing(shape, dtype, device, copyStream);
  if (!ring_)
    throw std::runtime_error("this ganc was built without CUDA");
  auto format = channelsLast && shape.size() == 4 ? at::MemoryFormat::ChannelsLast
                                                  : at::MemoryFormat::Contiguous;
  device_ = torch::empty(shape, at::TensorOptions(device).dtype(dtype).memory_format(format));
}

StagedBatch::~StagedBatch() = default;

void StagedBatch::stage(const at::Tensor &source, const at::Tensor &indices) {
  if (ring_)
    ring_->stage(device_, source, indices);
  else
    device_ = source.index_select(0, indices);
}

PhaseTimer::PhaseTimer(c10::Device device) {
  if (device.is_cuda())
    events_ = gpu::makeEventTimer();
}

PhaseTimer::~PhaseTimer() = default;

void PhaseTimer::begin() {
  if (events_)
    events_->begin();
}

void PhaseTimer::end(size_t index) {
  if (!events_)
    return;
  events_->end(index);
  collect(false);
}

void PhaseTimer::collect(bool wait) {
  if (events_)
    events_->collect(wait, seconds_);
}

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// CPU with CUDA, as torch.profiler's default: the eager loops' figures are taken this way.
const std::set<ActivityType> kActivities = {ActivityType::CPU, ActivityType::CUDA};

void synchronizeDevice() { gpu::synchronize(); }

} // namespace

KernelTrace::KernelTrace() {
  if (!gpu::built())
    throw std::runtime_error("this ganc was built without CUDA");
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
  if (device.is_cuda()) {
    at::Generator gen = gpu::defaultGenerator(device);
    if (!gen.defined())
      throw std::runtime_error("this ganc was built without CUDA");
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
    return gen;
  }
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
  if (device.is_cuda()) {
    device_ = gpu::defaultGenerator(device);
    if (device_.defined())
      deviceState_ = device_.get_state();
  }
}

ForkedRng::~ForkedRng() {
  cpu_.set_state(cpuState_);
  if (device_.defined())
    device_.set_state(deviceState_);
}

} // namespace ganc::backend
