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
#include "backend/cuda/CudaGraphExecutor.h"

#ifdef GANC_WITH_CUDA_KERNELS
#include "backend/cuda/FillKernel.h"
#endif
#include "support/torch/TorchError.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
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

/// What the graph-safe generators' device tensors (the seed and the offset every captured
/// random op reads when it runs) hold once the work enqueued so far has run, per generator
/// state; a state not listed is unknown.
struct RngOnDevice {
  struct Known {
    uint64_t seed = 0;
    uint64_t offset = 0;
  };
  std::map<const at::CUDAGeneratorState *, Known> known;
};

/// Which of a captured graph's other nodes become kernel nodes (--memset-nodes, --copy-nodes).
struct NodesAsKernels {
  bool memsets = true;
  bool copies = true;
};

/// A captured phase whose replay is one graph launch. PyTorch's CUDAGraph::replay writes a
/// generator's seed and Philox offset into those device tensors with two fill kernels before
/// every launch of a graph that draws random numbers (noise, dropout, augmentation): two
/// dispatcher calls and two kernel launches of host time per replayed phase. Here the graph
/// itself advances the offset tensor, as its last node, by the offsets it consumed, and the
/// host advances the generator's own offset as PyTorch does; so while nothing else drew from
/// the generator or captured since the previous replay, the device already holds what the
/// fills would write and they are skipped. Anything else (an eager phase's draws, a new
/// capture, a reseed) makes the host and device disagree, and the replay writes them as
/// PyTorch does. The random numbers are the same either way.
class PhaseGraph : public at::cuda::CUDAGraph {
public:
  /// The captured graph is kept beside its executable: step graphs take it as a child, and
  /// finishCapture counts its nodes.
  PhaseGraph() : at::cuda::CUDAGraph(/*keep_graph=*/true) {}

  /// Inside the capture, after the phase's work: the offset advance as the graph's last node.
  void advanceOffsetsOnDevice() {
    for (auto &[state, unused] : captured_generator_states_) {
      const uint64_t consumed = state->offset_intragraph_;
      if (consumed != 0 && state->offset_extragraph_.defined()) {
        at::Tensor(state->offset_extragraph_).add_(static_cast<int64_t>(consumed));
        advanced_[state.get()] = consumed;
      }
    }
  }

  /// After capture_end: the replay can skip the fills only if the graph advances exactly the
  /// offsets the capture recorded (otherwise every replay writes them, as PyTorch's does).
  /// The node passes `kernels` asks for run first (memset and copy nodes become kernel nodes).
  /// A kept graph is instantiated here (PyTorch defers that to its first replay).
  void finishCapture(const NodesAsKernels &kernels) {
    size_t drawing = 0;
    for (const auto &[state, increment] : captured_generator_states_) {
      if (increment == 0)
        continue;
      ++drawing;
      auto it = advanced_.find(state.get());
      if (it == advanced_.end() || it->second != increment)
        fillAlways_ = true;
    }
    fillAlways_ = fillAlways_ || drawing != advanced_.size();
    const NodesReplaced replaced = nodesToKernels(kernels);
    readShape();
    shape_.memsetsAsKernels = replaced.memsets;
    shape_.copiesAsKernels = replaced.copies;
    if (!has_graph_exec_)
      instantiate();
  }

  /// The captured graph's nodes by kind and its branches (what a launch submits;
  /// timing.json's graph_nodes and graph_branches).
  const GraphShape &shape() const { return shape_; }

  /// Whether the graph keeps the generators' device offsets itself (a step graph can hold it).
  bool advancesOffsets() const { return !fillAlways_; }

  /// The host side of a run of the graph, before it is launched: writes the generators'
  /// device tensors where they do not already hold the host state, then advances the host
  /// state by the offsets the graph consumes, as CUDAGeneratorState::replay_prologue does.
  void advanceGenerators(RngOnDevice &rng) {
    for (auto &[state, increment] : captured_generator_states_) {
      if (increment == 0)
        continue;
      auto known = rng.known.find(state.get());
      if (fillAlways_ || known == rng.known.end() || known->second.seed != state->seed_ ||
          known->second.offset != state->philox_offset_per_thread_) {
        at::Tensor(state->seed_extragraph_).fill_(static_cast<int64_t>(state->seed_));
        at::Tensor(state->offset_extragraph_)
            .fill_(static_cast<int64_t>(state->philox_offset_per_thread_));
      }
      TORCH_INTERNAL_ASSERT(state->philox_offset_per_thread_ % 4 == 0,
                            "RNG offset must be a multiple of 4");
      state->philox_offset_per_thread_ += (increment + 3) / 4 * 4; // CUDAGeneratorState::increase
      if (fillAlways_)
        rng.known.erase(state.get());
      else
        rng.known[state.get()] = {state->seed_, state->philox_offset_per_thread_};
    }
  }

  /// One replay on the current stream.
  void launch(RngOnDevice &rng) {
    c10::OptionalDeviceGuard deviceGuard{capture_stream_.device()};
    advanceGenerators(rng);
    C10_CUDA_CHECK(cudaGraphLaunch(graph_exec_, at::cuda::getCurrentCUDAStream()));
  }

private:
  /// Memset and copy nodes up to this size become kernels; a larger one's bandwidth outweighs
  /// the idle around its node.
  static constexpr size_t kMaxNodeBytes = size_t{1} << 20;

  struct NodesReplaced {
    int64_t memsets = 0;
    int64_t copies = 0;
  };

  /// The memset- and copy-to-kernel passes: replace each memset node of the captured graph
  /// (PyTorch's reductions clear their semaphores with cudaMemsetAsync, cuDNN its workspaces)
  /// and each copy node between two places in this GPU's memory (a tensor's copy_, such as the
  /// phase outputs' copy out of the pool) with a kernel node writing the same bytes, with the
  /// same dependencies and dependents. In DCGAN-64's phase graphs on an H100 (41 memsets per
  /// step) the GPU idled 1.5 us before and 2.4 us after each memset node, against 0.4 us
  /// between two kernel nodes: 178 of the 265 us of idle per step. A node whose edges carry
  /// data (programmatic launches), or that the runtime refuses to replace, stays as it was.
  NodesReplaced nodesToKernels(const NodesAsKernels &kernels) {
    NodesReplaced replaced;
#ifdef GANC_WITH_CUDA_KERNELS
    if (!kernels.memsets && !kernels.copies)
      return replaced;
    std::vector<cudaGraphNode_t> nodes;
    if (!listNodes(nodes))
      return replaced;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      if (!ok(cudaGraphNodeGetType(node, &type)))
        continue;
      if (type == cudaGraphNodeTypeMemset && kernels.memsets) {
        cudaMemsetParams memset{};
        if (ok(cudaGraphMemsetNodeGetParams(node, &memset)) &&
            memset.width * memset.elementSize * memset.height <= kMaxNodeBytes &&
            replace(node, [&memset](cudaGraphNode_t *kernel, cudaGraph_t graph,
                                    const cudaGraphNode_t *before, size_t count) {
              return addFillKernelNode(kernel, graph, before, count, memset);
            }))
          ++replaced.memsets;
      } else if (type == cudaGraphNodeTypeMemcpy && kernels.copies) {
        cudaMemcpy3DParms copy{};
        if (ok(cudaGraphMemcpyNodeGetParams(node, &copy)) &&
            copy.extent.width * copy.extent.height * copy.extent.depth <= kMaxNodeBytes &&
            onThisDevice(copy.srcPtr.ptr) && onThisDevice(copy.dstPtr.ptr) &&
            replace(node, [&copy](cudaGraphNode_t *kernel, cudaGraph_t graph,
                                  const cudaGraphNode_t *before, size_t count) {
              return addCopyKernelNode(kernel, graph, before, count, copy);
            }))
          ++replaced.copies;
      }
    }
#else
    (void)kernels; // built without a CUDA compiler: no kernels to put in their place
#endif
    return replaced;
  }

  /// Puts the kernel node `add` makes in `node`'s place (its dependencies and dependents) and
  /// removes `node`; false, the graph as it was, if the edges carry data or a call fails.
  template <typename Add> bool replace(cudaGraphNode_t node, Add &&add) {
    std::vector<cudaGraphNode_t> before, after;
    if (!plainEdges(node, /*dependencies=*/true, before) ||
        !plainEdges(node, /*dependencies=*/false, after))
      return false;
    cudaGraphNode_t kernel = nullptr;
    if (!ok(add(&kernel, graph_, before.data(), before.size())))
      return false;
    const std::vector<cudaGraphNode_t> from(after.size(), kernel);
    if (!after.empty() && !ok(addEdges(from, after))) {
      (void)cudaGraphDestroyNode(kernel); // back to the graph as captured
      return false;
    }
    // Both nodes write the same bytes before every dependent: the graph is right either way.
    return ok(cudaGraphDestroyNode(node));
  }

  /// Whether `ptr` is device memory of the GPU this graph runs on (what a kernel there can
  /// read and write; a copy from or to host, managed or another GPU's memory stays a copy).
  bool onThisDevice(const void *ptr) const {
    cudaPointerAttributes attributes{};
    return ptr && ok(cudaPointerGetAttributes(&attributes, ptr)) &&
           attributes.type == cudaMemoryTypeDevice &&
           attributes.device == capture_stream_.device_index();
  }

  /// Clears a failed call's error; true on success.
  static bool ok(cudaError_t status) {
    if (status == cudaSuccess)
      return true;
    (void)cudaGetLastError();
    return false;
  }

  /// The captured graph's nodes into `out`; false if the runtime cannot list them.
  bool listNodes(std::vector<cudaGraphNode_t> &out) const {
    size_t count = 0;
    if (!ok(cudaGraphGetNodes(graph_, nullptr, &count)))
      return false;
    out.assign(count, nullptr);
    if (count > 0 && !ok(cudaGraphGetNodes(graph_, out.data(), &count)))
      return false;
    out.resize(count);
    return true;
  }

  /// A node's dependencies (or dependents) into `out`; false if any of those edges carries data
  /// (or the runtime cannot list them).
  static bool plainEdges(cudaGraphNode_t node, bool dependencies,
                         std::vector<cudaGraphNode_t> &out) {
#if CUDART_VERSION >= 13000
    auto list = [&](cudaGraphNode_t *nodes, cudaGraphEdgeData *data, size_t *n) {
      return dependencies ? cudaGraphNodeGetDependencies(node, nodes, data, n)
                          : cudaGraphNodeGetDependentNodes(node, nodes, data, n);
    };
    size_t n = 0;
    if (!ok(list(nullptr, nullptr, &n)))
      return false;
    out.assign(n, nullptr);
    std::vector<cudaGraphEdgeData> data(n);
    if (n > 0 && !ok(list(out.data(), data.data(), &n)))
      return false;
    out.resize(n);
    for (size_t i = 0; i < n; ++i)
      if (data[i].type != cudaGraphDependencyTypeDefault || data[i].from_port != 0 ||
          data[i].to_port != 0)
        return false;
    return true;
#else
    size_t n = 0;
    auto list = [&](cudaGraphNode_t *nodes, size_t *count) {
      return dependencies ? cudaGraphNodeGetDependencies(node, nodes, count)
                          : cudaGraphNodeGetDependentNodes(node, nodes, count);
    };
    if (!ok(list(nullptr, &n)))
      return false;
    out.assign(n, nullptr);
    if (n > 0 && !ok(list(out.data(), &n)))
      return false;
    out.resize(n);
    return true;
#endif
  }

  cudaError_t addEdges(const std::vector<cudaGraphNode_t> &from,
                       const std::vector<cudaGraphNode_t> &to) const {
#if CUDART_VERSION >= 13000
    return cudaGraphAddDependencies(graph_, from.data(), to.data(), nullptr, from.size());
#else
    return cudaGraphAddDependencies(graph_, from.data(), to.data(), from.size());
#endif
  }

  /// Counts the kept graph's nodes by type, and its branches. Only a statistic: where the
  /// runtime cannot list them, the shape stays empty and training goes on.
  void readShape() {
    auto failed = [this](cudaError_t status) {
      if (ok(status))
        return false;
      shape_ = GraphShape();
      return true;
    };
    std::vector<cudaGraphNode_t> nodes;
    if (!listNodes(nodes)) {
      shape_ = GraphShape();
      return;
    }
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      if (failed(cudaGraphNodeGetType(node, &type)))
        return;
      ++shape_.nodes[nodeKind(type)];
    }
    shape_.nodes["total"] = static_cast<int64_t>(nodes.size());
    // Branches: roots beyond the first, and every dependent of a node beyond its first.
    size_t roots = 0, edges = 0;
    if (failed(cudaGraphGetRootNodes(graph_, nullptr, &roots)) ||
        failed(edgeList(nullptr, nullptr, &edges)))
      return;
    std::vector<cudaGraphNode_t> from(edges), to(edges);
    if (edges > 0 && failed(edgeList(from.data(), to.data(), &edges)))
      return;
    std::map<cudaGraphNode_t, int64_t> dependents;
    for (size_t i = 0; i < edges; ++i)
      ++dependents[from[i]];
    shape_.branches = roots > 1 ? static_cast<int64_t>(roots) - 1 : 0;
    for (const auto &[node, n] : dependents)
      shape_.branches += n - 1;
  }

  cudaError_t edgeList(cudaGraphNode_t *from, cudaGraphNode_t *to, size_t *count) const {
#if CUDART_VERSION >= 13000
    // Edges with data (programmatic launch ports) are refused as a lossy query without it.
    std::vector<cudaGraphEdgeData> data(from ? *count : 0);
    return cudaGraphGetEdges(graph_, from, to, from ? data.data() : nullptr, count);
#else
    return cudaGraphGetEdges(graph_, from, to, count);
#endif
  }

  static const char *nodeKind(cudaGraphNodeType type) {
    switch (type) {
    case cudaGraphNodeTypeKernel:
      return "kernel";
    case cudaGraphNodeTypeMemcpy:
      return "memcpy";
    case cudaGraphNodeTypeMemset:
      return "memset";
    case cudaGraphNodeTypeHost:
      return "host";
    case cudaGraphNodeTypeGraph:
      return "child_graph";
    case cudaGraphNodeTypeEmpty:
      return "empty";
    case cudaGraphNodeTypeWaitEvent:
      return "event_wait";
    case cudaGraphNodeTypeEventRecord:
      return "event_record";
    case cudaGraphNodeTypeMemAlloc:
      return "mem_alloc";
    case cudaGraphNodeTypeMemFree:
      return "mem_free";
    default:
      return "other";
    }
  }

  std::map<const at::CUDAGeneratorState *, uint64_t> advanced_;
  bool fillAlways_ = false;
  GraphShape shape_;
};

/// A step's phases as one executable graph: each phase's captured graph a child node,
/// chained in the step's order, so one launch runs the step (the phases' RNG offsets advance
/// on the device from child to child). Built once per sequence of phases.
class StepGraph {
public:
  static std::unique_ptr<StepGraph> build(const std::vector<PhaseGraph *> &phases,
                                          c10::Device device, std::string &error) {
    cudaGraph_t graph = nullptr;
    cudaError_t status = cudaGraphCreate(&graph, 0);
    cudaGraphNode_t previous = nullptr;
    for (size_t i = 0; status == cudaSuccess && i < phases.size(); ++i) {
      cudaGraphNode_t node = nullptr;
      status = cudaGraphAddChildGraphNode(&node, graph, previous ? &previous : nullptr,
                                          previous ? 1 : 0, phases[i]->raw_cuda_graph());
      previous = node;
    }
    cudaGraphExec_t exec = nullptr;
    if (status == cudaSuccess)
      status = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    if (graph)
      (void)cudaGraphDestroy(graph); // the executable does not need it
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      error = cudaGetErrorString(status);
      return nullptr;
    }
    auto step = std::unique_ptr<StepGraph>(new StepGraph());
    step->phases_ = phases;
    step->device_ = device;
    step->exec_ = exec;
    return step;
  }
  ~StepGraph() {
    if (exec_)
      (void)cudaGraphExecDestroy(exec_);
  }
  StepGraph(const StepGraph &) = delete;
  StepGraph &operator=(const StepGraph &) = delete;

  void launch(RngOnDevice &rng) {
    c10::OptionalDeviceGuard deviceGuard{device_};
    for (PhaseGraph *phase : phases_)
      phase->advanceGenerators(rng);
    C10_CUDA_CHECK(cudaGraphLaunch(exec_, at::cuda::getCurrentCUDAStream()));
  }

private:
  StepGraph() = default;
  std::vector<PhaseGraph *> phases_;
  c10::Device device_ = c10::kCUDA;
  cudaGraphExec_t exec_ = nullptr;
};

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

void CudaGraphExecutor::beginStep(const std::vector<std::string> &phases) {
  step_ = nullptr;
  stepPhases_ = nullptr;
  stepNext_ = 0;
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

/// Host seconds `launch` takes.
template <typename F> double timed(F &&launch) {
  auto start = std::chrono::steady_clock::now();
  launch();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

} // namespace

at::Tensor CudaGraphExecutor::run(const std::string &phase, const InputFn &inputs,
                                  const StepFn &step) {
  Captured &c = *phases_.at(phase);
  lastRun_ = RunStats();
  if (step_) {
    // A step graph: the phases before the last only hand out their outputs (their data is
    // staged before each run() call, so the one launch comes at the last call).
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
