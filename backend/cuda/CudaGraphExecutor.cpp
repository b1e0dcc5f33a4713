// Whole-phase CUDA Graph capture and replay.
//
// Per phase: `warmupIterations` eager runs on a side stream (they are real training
// iterations), then one capture of the whole phase on that side stream — inputs made inside
// the capture (noise from the graph-safe default CUDA generator, data from the static device
// batch the runtime refills before each step), gradients accumulated into the reducer's
// bucket slots, the NCCL all-reduces joined back by events, the optimizer step — and from
// then on one replay per iteration. All phases share one memory pool: they never run
// concurrently, and replay order on the one stream keeps their buffers apart in time.
#include "backend/cuda/CudaGraphExecutor.h"

#include "frontend/TorchError.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <iostream>

namespace ganc::backend {

namespace {

/// A phase's timeline on the GPU: one timing CUDA event per point, recorded on the stream the
/// work is issued to. Recorded while a phase is captured, an event becomes an event-record
/// node of the graph (cudaEventRecordExternal, torch's external events), so every replay
/// records it again when the device reaches that point: the times are the graph's own, with
/// no host launches between kernels.
class EventTimeline : public RunTimeline {
public:
  EventTimeline(size_t buckets, size_t parameters) : RunTimeline(buckets, parameters) {
    events_.reserve(size());
    for (size_t i = 0; i < size(); ++i)
      events_.emplace_back(cudaEventDefault | cudaEventExternal);
  }
  void mark(size_t point) override { events_[point].record(at::cuda::getCurrentCUDAStream()); }
  std::vector<double> read() override {
    std::vector<double> seconds;
    seconds.reserve(events_.size());
    for (const at::cuda::CUDAEvent &event : events_) {
      event.synchronize();
      seconds.push_back(events_[Start].elapsed_time(event) / 1000.0);
    }
    return seconds;
  }

private:
  std::vector<at::cuda::CUDAEvent> events_;
};

} // namespace

struct CudaGraphExecutor::Captured {
  const ir::Phase *plan = nullptr;
  int warmupsLeft = 0;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  at::Tensor loss; // the graph's output, overwritten by every replay
  std::vector<std::pair<std::string, at::Tensor>> stats; // the logged values, likewise
};

Expected<std::unique_ptr<CudaGraphExecutor>>
CudaGraphExecutor::create(const ir::Module &plan, torch::jit::Module module,
                          c10::intrusive_ptr<c10d::Backend> group, const ExecutorOptions &options) {
  if (!options.device.is_cuda())
    return Status::error("the CUDA executor needs a CUDA device");
  ExecutorOptions eagerOptions = options;
  eagerOptions.timelines = [](size_t buckets, size_t parameters) {
    return std::make_unique<EventTimeline>(buckets, parameters);
  };
  auto eager = EagerExecutor::create(plan, module, group, eagerOptions);
  if (!eager)
    return eager.status();
  auto e = std::unique_ptr<CudaGraphExecutor>(new CudaGraphExecutor());
  e->eager_ = eager.take();
  e->options_ = eagerOptions;
  e->side_ = std::make_unique<c10::cuda::CUDAStream>(
      at::cuda::getStreamFromPool(/*isHighPriority=*/false, options.device.index()));
  e->pool_ = at::cuda::graph_pool_handle();
  for (const auto &phase : plan.phases) {
    auto captured = std::make_unique<Captured>();
    captured->plan = phase.get();
    captured->warmupsLeft = options.warmupIterations;
    e->phases_[phase->key()] = std::move(captured);
  }
  return e;
}

CudaGraphExecutor::~CudaGraphExecutor() = default;

const PhaseReducer &CudaGraphExecutor::reducer(const std::string &phase) const {
  return eager_->reducer(phase);
}

std::string CudaGraphExecutor::mode(const std::string &phase) const {
  const Captured &c = *phases_.at(phase);
  if (!c.plan->eagerReason.empty())
    return "eager (" + c.plan->eagerReason + ")";
  return options_.useGraphs ? "cuda-graph" : "eager";
}

namespace {

/// Makes `waiter` wait for everything enqueued on `done` so far.
void join(const at::cuda::CUDAStream &waiter, const at::cuda::CUDAStream &done) {
  at::cuda::CUDAEvent event;
  event.record(done);
  event.block(waiter);
}

} // namespace

at::Tensor CudaGraphExecutor::run(const std::string &phase, const InputFn &inputs,
                                  const StepFn &step) {
  Captured &c = *phases_.at(phase);
  lastRun_ = RunStats();
  if (!c.plan->eagerReason.empty() || !options_.useGraphs) {
    if (!c.plan->eagerReason.empty() && loggedEager_.insert(phase).second)
      std::cerr << "ganc: phase '" << phase << "' runs eagerly: " << c.plan->eagerReason
                << std::endl;
    at::Tensor loss = eager_->run(phase, inputs, step);
    lastStats_ = eager_->lastStats();
    if (options_.profile)
      lastRun_ = eager_->timedRun(phase);
    return loss;
  }
  if (!c.graph) {
    // Warm-up and capture happen on a side stream, as torch.cuda.graphs does: capture cannot
    // start on the legacy default stream, and warm-up there keeps its allocations apart.
    const at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream();
    const at::cuda::CUDAStream side = *side_;
    join(side, current);
    at::Tensor loss;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      if (c.warmupsLeft > 0) {
        --c.warmupsLeft;
        loss = eager_->run(phase, inputs, step);
        lastStats_ = eager_->lastStats();
      } else {
        c.graph = std::make_unique<at::cuda::CUDAGraph>();
        try {
          c.graph->capture_begin(pool_);
          c.loss = eager_->run(phase, inputs, step);
          c.stats = eager_->lastStats();
          c.graph->capture_end();
        } catch (const std::exception &e) {
          throw std::runtime_error("capturing phase '" + phase + "' as a CUDA Graph failed (" +
                                   frontend::firstLine(e) +
                                   "); --cuda-graphs off runs every phase eagerly");
        }
      }
    }
    join(current, side);
    if (!c.graph)
      return loss;
    // Capture records the phase without running it: this iteration is the first replay.
    c.graph->replay();
    lastStats_ = c.stats;
    return c.loss;
  }
  auto start = std::chrono::steady_clock::now();
  c.graph->replay();
  const double launchSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options_.profile)
    lastRun_ = eager_->timedRun(phase); // waits for the replay
  lastRun_.launchSeconds = launchSeconds;
  lastRun_.replayed = true;
  lastStats_ = c.stats;
  return c.loss;
}

} // namespace ganc::backend
