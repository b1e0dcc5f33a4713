// Whole-phase CUDA Graph capture and replay.
//
// Per phase: `warmupIterations` eager runs on a side stream (they are real training
// iterations), then one capture of the whole phase on that side stream — inputs made inside
// the capture (noise from the graph-safe default CUDA generator, data from the static device
// batch the runtime refills before each step), gradients accumulated into the reducer's
// bucket slots, the NCCL all-reduces joined back by events, the optimizer step — and from
// then on one replay per iteration. All phases share one memory pool: they never run
// concurrently, and replay order on the one stream keeps their buffers apart in time.
// A replay is one cudaGraphLaunch (PhaseGraph keeps the RNG offsets on the device); with step
// graphs, a step whose phases are all captured is one launch for all of them (StepGraph).
//
// A step whose phases share values (pix2pix: a section computes the fake once, phase d takes
// it detached, phase g back-propagates through it) is warmed up and captured as one graph,
// from its first call (a section or a phase) to endStep(), and replayed at its first phase's
// call from then on (Linked). The shared values, and what a later backward reads of the graph that
// made them, are then the graph's own tensors at fixed addresses, and the phases run in the
// spec's order inside it, as the eager loop they replace.
#include "backend/cuda/CudaGraphExecutor.h"

#include "backend/cuda/PhaseGraph.h"
#include "backend/cuda/StepGraph.h"
#include "support/torch/TorchError.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
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
  std::unique_ptr<PhaseGraph> graph;
  /// The graph's outputs, overwritten by every replay: the loss and the logged values, read
  /// by the host once the whole step is issued. Allocated outside the graphs' shared pool
  /// (from the last warm-up's shapes), and the graph's last work copies into them: a phase
  /// captured later than another but replayed before it (StyleGAN2's lazy Greg, first
  /// captured after Dmain, runs before it) could otherwise get its outputs in memory the
  /// earlier capture freed, which that graph's replay overwrites with its temporaries later in
  /// the same step.
  at::Tensor loss;
  std::vector<std::pair<std::string, at::Tensor>> stats;
};

/// A step whose phases share values, captured as one graph (see the file comment). What each
/// call hands out is what it handed out at capture, rewritten by every replay.
struct CudaGraphExecutor::Linked {
  int warmupsLeft = 0;
  std::unique_ptr<PhaseGraph> graph;
  bool capturing = false;
  /// The step's phase keys, for messages ("d, g").
  std::string names;
  /// Each section run's values, in call order: the graph's tensors, read only by the later
  /// phases inside the same graph.
  std::vector<c10::impl::GenericDict> sections;
  struct Outputs {
    /// The loss and logged values: outside the graphs' pool, written by the graph's last
    /// work for the phase (as Captured's); during warm-up the last eager run's.
    at::Tensor loss;
    std::vector<std::pair<std::string, at::Tensor>> stats;
    /// The values the phase hands on, per micro-batch: the graph's, as the sections'.
    std::vector<std::map<std::string, at::Tensor>> handed;
  };
  std::map<std::string, Outputs> phases;
};

namespace {

/// Tensors shaped like `from`'s, allocated on the current stream (outside any capture).
std::vector<std::pair<std::string, at::Tensor>>
emptyLike(const std::vector<std::pair<std::string, at::Tensor>> &from) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto &[name, t] : from)
    out.emplace_back(name, at::empty_like(t));
  return out;
}

/// Inside a capture: the run's outputs into the tensors kept for them, which must have their
/// shapes and dtypes (a phase's outputs keep theirs from warm-up to capture). One multi-tensor
/// copy, one kernel node where they share a dtype (a copy node each otherwise, which the
/// copy-to-kernel pass may then replace).
void copyOut(const at::Tensor &keptLoss,
             const std::vector<std::pair<std::string, at::Tensor>> &keptStats,
             const at::Tensor &loss, const std::vector<std::pair<std::string, at::Tensor>> &stats) {
  std::vector<at::Tensor> kept, values;
  auto add = [&](const at::Tensor &into, const at::Tensor &value, const std::string &what) {
    if (!into.defined() || into.sizes() != value.sizes() || into.dtype() != value.dtype())
      throw std::runtime_error(what + " changed shape or dtype between warm-up and capture");
    kept.push_back(into);
    values.push_back(value);
  };
  add(keptLoss, loss, "the loss");
  for (size_t i = 0; i < std::max(stats.size(), keptStats.size()); ++i) {
    if (i >= stats.size() || i >= keptStats.size() || stats[i].first != keptStats[i].first)
      throw std::runtime_error("the logged values changed between warm-up and capture");
    add(keptStats[i].second, stats[i].second, "logged value '" + stats[i].first + "'");
  }
  at::_foreach_copy_(kept, values);
}

} // namespace

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
  e->rng_ = std::make_unique<RngOnDevice>();
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
  if (!options_.useGraphs)
    return "eager";
  return c.plan->sharesValues() ? "cuda-graph, with the phases it shares values with"
                                : "cuda-graph";
}

namespace {

/// Makes `waiter` wait for everything enqueued on `done` so far.
void join(const at::cuda::CUDAStream &waiter, const at::cuda::CUDAStream &done) {
  at::cuda::CUDAEvent event;
  event.record(done);
  event.block(waiter);
}

} // namespace

std::string CudaGraphExecutor::linkedEagerReason(const std::vector<std::string> &phases) const {
  if (options_.profile)
    return "--profile times each phase on its own";
  if (options_.keepGradients)
    return "--dump-grads reads each phase's sharded gradients before the next phase's "
           "overwrite them";
  for (const std::string &phase : phases) {
    const ir::Phase &plan = *phases_.at(phase)->plan;
    if (!plan.eagerReason.empty())
      return "phase '" + phase + "' of its step runs eagerly (" + plan.eagerReason + ")";
  }
  return "";
}

void CudaGraphExecutor::beginStep(const std::vector<std::string> &phases) {
  step_ = nullptr;
  stepPhases_ = nullptr;
  stepNext_ = 0;
  linkedStep_ = nullptr;
  linkedStarted_ = false;
  linkedSections_ = 0;
  linkedEager_.clear();
  bool shares = false;
  for (const std::string &phase : phases)
    shares = shares || phases_.at(phase)->plan->sharesValues();
  if (shares) {
    if (!options_.useGraphs)
      return;
    linkedEager_ = linkedEagerReason(phases);
    if (!linkedEager_.empty())
      return;
    std::unique_ptr<Linked> &linked = linked_[phases];
    if (!linked) {
      linked = std::make_unique<Linked>();
      linked->warmupsLeft = options_.warmupIterations;
      for (const std::string &phase : phases)
        linked->names += (linked->names.empty() ? "" : ", ") + phase;
    }
    linkedStep_ = linked.get();
    return;
  }
  if (!options_.useGraphs || !options_.stepGraphs || phases.empty())
    return;
  for (const std::string &phase : phases) {
    const Captured &c = *phases_.at(phase);
    // Not yet captured, eager, or drawing random numbers in a way only PyTorch's replay
    // keeps right: this step's phases run one by one.
    if (!c.graph || !c.plan->eagerReason.empty() || !c.graph->advancesOffsets())
      return;
  }
  auto found = stepGraphs_.find(phases);
  if (found == stepGraphs_.end()) {
    std::vector<PhaseGraph *> graphs;
    for (const std::string &phase : phases)
      graphs.push_back(phases_.at(phase)->graph.get());
    std::string error;
    std::unique_ptr<StepGraph> built = StepGraph::build(graphs, options_.device, error);
    if (!built)
      std::cerr << "ganc: the phases of a step could not be made one graph (" << error
                << "); they replay one by one" << std::endl;
    found = stepGraphs_.emplace(phases, std::move(built)).first;
  }
  if (!found->second)
    return;
  step_ = found->second.get();
  stepPhases_ = &found->first;
}

namespace {

/// Why a phase sharing values runs eagerly when no step announced it (beginStep).
const std::string kUnannounced = "it shares values with other phases, and its step was not "
                                 "announced to be captured with them";

/// Host seconds `launch` takes.
template <typename F> double timed(F &&launch) {
  auto start = std::chrono::steady_clock::now();
  launch();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

} // namespace

std::runtime_error CudaGraphExecutor::linkedCaptureFailed(Linked &l, const std::exception &e) {
  l.capturing = false;
  l.graph.reset();
  return std::runtime_error("capturing the phases that share values (" + l.names +
                            ") as one CUDA Graph failed (" + firstLine(e) +
                            "); --cuda-graphs off runs every phase eagerly");
}

double CudaGraphExecutor::startLinked() {
  if (linkedStarted_)
    return 0;
  linkedStarted_ = true;
  Linked &l = *linkedStep_;
  if (l.graph)
    return timed([&] { l.graph->launch(*rng_); });
  // Warm-up and capture on the side stream, as a phase's (see run()), until endStep().
  join(*side_, at::cuda::getCurrentCUDAStream());
  if (l.warmupsLeft > 0)
    return 0;
  l.graph = std::make_unique<PhaseGraph>();
  rng_->known.clear(); // capture writes the generators' device tensors
  c10::cuda::CUDAStreamGuard guard(*side_);
  l.capturing = true;
  try {
    // Relaxed: the capture spans the Trainer's code between this executor's calls, which
    // queries the timing events of earlier phases (cudaEventQuery on the compute stream) and
    // may allocate outside the graphs' pool. Global mode, torch's default, forbids both while
    // any stream captures ("operation not permitted when stream is capturing", on an H100).
    l.graph->capture_begin(pool_, cudaStreamCaptureModeRelaxed);
  } catch (const std::exception &e) {
    throw linkedCaptureFailed(l, e);
  }
  return 0;
}

template <typename F> auto CudaGraphExecutor::onSide(F &&work) {
  Linked &l = *linkedStep_;
  c10::cuda::CUDAStreamGuard guard(*side_);
  if (!l.capturing)
    return work();
  try {
    return work();
  } catch (const std::exception &e) {
    // End the broken capture (its error is the one to report) before saying what failed.
    try {
      l.graph->capture_end();
    } catch (const std::exception &) {
    }
    throw linkedCaptureFailed(l, e);
  }
}

void CudaGraphExecutor::endStep() {
  Linked *l = linkedStep_;
  linkedStep_ = nullptr;
  if (!l || !linkedStarted_ || (l->graph && !l->capturing))
    return; // nothing linked, or replayed at the step's first phase
  const at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream();
  if (!l->capturing) { // a warm-up
    join(current, *side_);
    --l->warmupsLeft;
    // Where the capture will copy the losses and logged values: like this warm-up's.
    for (auto &[phase, out] : l->phases) {
      out.loss = at::empty_like(out.loss);
      out.stats = emptyLike(out.stats);
    }
    return;
  }
  {
    c10::cuda::CUDAStreamGuard guard(*side_);
    try {
      l->graph->advanceOffsetsOnDevice();
      l->graph->capture_end();
      l->graph->finishCapture({options_.memsetsAsKernels, options_.copiesAsKernels});
    } catch (const std::exception &e) {
      throw linkedCaptureFailed(*l, e);
    }
    l->capturing = false;
  }
  join(current, *side_);
  // Capture records the step without running it: this is its first replay.
  l->graph->launch(*rng_);
}

c10::impl::GenericDict CudaGraphExecutor::runSection(const SectionCall &call, const InputFn &inputs,
                                                     int64_t micro) {
  if (!linkedStep_)
    return eager_->runSection(call, inputs, micro);
  Linked &l = *linkedStep_;
  // Replayed, the graph is launched at the step's first phase (whose device timer then
  // covers the step's work), not here: the section's values are only read inside it.
  if (!l.graph || l.capturing)
    startLinked();
  const size_t index = linkedSections_++;
  if (l.graph && !l.capturing) {
    if (index >= l.sections.size())
      throw std::runtime_error("section '" + call.method +
                               "' run more often than in the captured step (" + l.names + ")");
    return l.sections[index];
  }
  c10::impl::GenericDict values = onSide([&] { return eager_->runSection(call, inputs, micro); });
  if (l.capturing)
    l.sections.push_back(values);
  return values;
}

at::Tensor CudaGraphExecutor::runLinked(const std::string &phase, const InputFn &inputs,
                                        const StepFn &step) {
  Linked &l = *linkedStep_;
  Linked::Outputs &out = l.phases[phase];
  lastRun_.launchSeconds = startLinked();
  if (l.graph && !l.capturing) { // replayed at the step's first phase
    lastRun_.replayed = true;
    lastStats_ = out.stats;
    lastOutputs_ = out.handed;
    return out.loss;
  }
  const at::Tensor loss = onSide([&] { return eager_->run(phase, inputs, step); });
  lastOutputs_ = eager_->lastOutputs();
  // Warmed up or captured on the side stream, which the compute stream joins at endStep().
  lastRun_.deferred = true;
  if (!l.capturing) { // a warm-up
    out.loss = loss;
    out.stats = eager_->lastStats();
    lastStats_ = out.stats;
    return loss;
  }
  onSide([&] { copyOut(out.loss, out.stats, loss, eager_->lastStats()); });
  out.handed = lastOutputs_;
  lastStats_ = out.stats;
  return out.loss;
}

at::Tensor CudaGraphExecutor::runInStepGraph(const std::string &phase) {
  // The phases before the last only hand out their outputs (their data is staged before each
  // run() call, so the one launch comes at the last call).
  const Captured &c = *phases_.at(phase);
  const std::vector<std::string> &order = *stepPhases_;
  if (stepNext_ >= order.size() || order[stepNext_] != phase)
    throw std::runtime_error("phase '" + phase + "' run out of the step's announced order");
  lastRun_.replayed = true;
  lastStats_ = c.stats;
  if (++stepNext_ == order.size()) {
    lastRun_.launchSeconds = timed([&] { step_->launch(*rng_); });
    step_ = nullptr;
  }
  return c.loss;
}

at::Tensor CudaGraphExecutor::run(const std::string &phase, const InputFn &inputs,
                                  const StepFn &step) {
  Captured &c = *phases_.at(phase);
  lastRun_ = RunStats();
  lastOutputs_.clear();
  if (linkedStep_)
    return runLinked(phase, inputs, step);
  if (step_)
    return runInStepGraph(phase);
  // A phase sharing values outside a captured linked step: its step runs eagerly.
  const std::string &why = !c.plan->eagerReason.empty() || !c.plan->sharesValues()
                               ? c.plan->eagerReason
                           : linkedEager_.empty() ? kUnannounced
                                                  : linkedEager_;
  if (!why.empty() || !options_.useGraphs) {
    if (!why.empty() && options_.useGraphs && loggedEager_.insert(phase).second)
      std::cerr << "ganc: phase '" << phase << "' runs eagerly: " << why << std::endl;
    at::Tensor loss = eager_->run(phase, inputs, step);
    lastStats_ = eager_->lastStats();
    lastOutputs_ = eager_->lastOutputs(); // a captured phase hands nothing on
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
        c.graph = std::make_unique<PhaseGraph>();
        // Capture writes the generators' device tensors (their seed, offset 0).
        rng_->known.clear();
        try {
          c.graph->capture_begin(pool_);
          const at::Tensor loss = eager_->run(phase, inputs, step);
          copyOut(c.loss, c.stats, loss, eager_->lastStats());
          c.graph->advanceOffsetsOnDevice();
          c.graph->capture_end();
          c.graph->finishCapture({options_.memsetsAsKernels, options_.copiesAsKernels});
        } catch (const std::exception &e) {
          throw std::runtime_error("capturing phase '" + phase + "' as a CUDA Graph failed (" +
                                   firstLine(e) + "); --cuda-graphs off runs every phase eagerly");
        }
      }
    }
    join(current, side);
    if (!c.graph) {
      // Where the capture will copy its outputs (see Captured): like this warm-up's.
      c.loss = at::empty_like(loss);
      c.stats = emptyLike(lastStats_);
      return loss;
    }
    // Capture records the phase without running it: this iteration is the first replay.
    c.graph->launch(*rng_);
    lastStats_ = c.stats;
    return c.loss;
  }
  const double launchSeconds = timed([&] { c.graph->launch(*rng_); });
  if (options_.profile)
    lastRun_ = eager_->timedRun(phase); // waits for the replay
  lastRun_.launchSeconds = launchSeconds;
  lastRun_.replayed = true;
  lastStats_ = c.stats;
  return c.loss;
}

GraphShapes CudaGraphExecutor::graphShapes() const {
  GraphShapes shapes;
  for (const auto &[key, c] : phases_)
    if (c->graph && !c->graph->shape().nodes.empty())
      shapes[key] = c->graph->shape();
  return shapes;
}

} // namespace ganc::backend
