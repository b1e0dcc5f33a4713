// Executes the phases of a compiled plan on one rank: forward, backward, bucketed
// all-reduces, then the caller's optimizer step.
#pragma once

#include "backend/JointProgram.h"
#include "backend/Reducer.h"
#include "ir/Module.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/script.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ganc::backend {

struct ExecutorOptions {
  c10::Device device = c10::kCPU;
  /// Broadcast every buffer from rank 0 before each phase (DDP's broadcast_buffers=True).
  bool broadcastBuffers = false;
  /// The graphs phases run instead of their method, by phase key ("d", "d@8x8"): a
  /// progressive GAN's stage-specialised phases, phases with synchronised batch norm; called
  /// with the module and the inputs. Phases not listed run their method.
  std::map<std::string, std::shared_ptr<torch::jit::Graph>> phaseGraphs;
  /// The joint graphs phases run instead (ganc train --executor joint), by phase key: forward
  /// and gradients through ganc's executor, no autograd engine, no TorchScript interpreter.
  /// CPU only.
  std::map<std::string, std::shared_ptr<const JointProgram>> jointPrograms;
  /// The loss scale of each phase that uses dynamic loss scaling, by phase name: a 0-dim
  /// device tensor the runtime's loss scaler updates in place; the loss is multiplied by it
  /// before backward.
  std::map<std::string, at::Tensor> lossScales;
  /// Sharded (ZeRO) with --dump-grads: keep each phase's averaged gradient shards after its
  /// step (the dump reads them); otherwise the all-gather reuses their memory.
  bool keepGradients = false;
  /// CUDA: capture each phase and replay it (false: run every phase eagerly on the GPU).
  bool useGraphs = true;
  /// CUDA, with useGraphs: a step whose phases are all captured (and keep their RNG offsets
  /// on the device) is one launch of a graph made of their graphs (see beginStep).
  bool stepGraphs = false;
  /// NCCL: issue the gradient collectives on the compute stream, each when its bucket is
  /// complete, rather than on NCCL's own stream (overlapping the rest of backward). With one
  /// rank nothing overlaps anyway, and a captured phase is then one straight line of nodes,
  /// which CUDA 12.6 and later launch in near-constant host time however many nodes it has.
  /// The runtime sets this at world size 1 (--comm-stream). Collectives waited for at once
  /// (synchronised batch norm, the buffer broadcast) always run on the compute stream.
  bool collectivesOnComputeStream = false;
  /// CUDA: after its capture, each memset node of a phase graph (up to 1 MiB) becomes a kernel
  /// node writing the same bytes (see PhaseGraph::memsetsToKernels): on an H100 the GPU idled
  /// 1.5 us before and 2.4 us after each memset node, against 0.4 us between two kernels.
  bool memsetsAsKernels = true;
  /// CUDA: likewise each copy node between two places in the GPU's memory (up to 1 MiB), such
  /// as a phase's loss copied out of the graphs' pool.
  bool copiesAsKernels = true;
  /// CUDA: eager iterations of each phase before it is captured (allocator, cuDNN and NCCL
  /// communicator set-up happen there, outside the graph; at least 1).
  int warmupIterations = 3;
  /// Time every run (ganc train --profile): lastRun() then says when each bucket and
  /// parameter was ready. Timelines come from `timelines` (the host clock when unset; CUDA
  /// events on a GPU, where reading them waits for the device after each phase).
  bool profile = false;
  TimelineFactory timelines;
};

/// Called after a phase's gradients are all-reduced, with that phase's used parameters; the
/// runtime's optimizers step there (inside the captured graph on CUDA).
using StepFn = std::function<void(const std::string &phase, PhaseReducer &)>;

/// Produces a phase's inputs for micro-batch `micro` (0 unless the phase accumulates) in the
/// method's argument order. On CUDA it runs inside the captured region, so noise drawn there
/// is drawn anew by every replay.
using InputFn = std::function<std::vector<at::Tensor>(int64_t micro)>;

/// How the last phase run went, for timing.json.
struct RunStats {
  /// Only a replay of a captured graph (not a warm-up, capture or eager run).
  bool replayed = false;
  /// The run's work is complete only at endStep() (a step whose phases share values, warmed
  /// up on a side stream or captured): its gradients can be read only after that.
  bool deferred = false;
  /// Host seconds of the graph launch itself (the generators' RNG bookkeeping, then
  /// cudaGraphLaunch); the rest of a replayed run is ganc's own.
  double launchSeconds = 0;
  /// A timed run (ExecutorOptions::profile; on CUDA only replays of a captured phase and runs
  /// of an eager phase, not warm-ups), in seconds from its start: when the last backward
  /// ended, when each bucket's last gradient was ready (by bucket index), and the optimizer
  /// step's seconds.
  bool profiled = false;
  double backwardSeconds = 0;
  /// When the last all-reduce had completed (the optimizer step starts there).
  double reducedSeconds = 0;
  std::vector<double> bucketReadySeconds;
  /// When each used parameter's gradient was ready (as the reducer's usedNames()).
  std::vector<double> parameterReadySeconds;
  double stepSeconds = 0;
};

/// A captured phase graph's shape: what one launch submits.
struct GraphShape {
  /// Nodes by kind ("kernel", "memset", "memcpy", "event_record", ..., and "total").
  std::map<std::string, int64_t> nodes;
  /// The paths the graph runs beside its first: its roots beyond one, plus each node's
  /// dependents beyond one. 0: one straight line of nodes.
  int64_t branches = 0;
  /// Memset nodes the capture made that became kernel nodes (ExecutorOptions::memsetsAsKernels);
  /// `nodes` counts them as kernels.
  int64_t memsetsAsKernels = 0;
  /// Copy nodes that became kernel nodes (ExecutorOptions::copiesAsKernels).
  int64_t copiesAsKernels = 0;
};
/// Each captured phase graph's shape, by phase key.
using GraphShapes = std::map<std::string, GraphShape>;

/// One run of a section: a phase without a loss, run once per step for the phases after it.
struct SectionCall {
  std::string method;
  /// The autocast dtype of its forward ("bf16", "f16"), or "" for none.
  std::string autocast;
  /// Whether the run records the use of the parameter named so (what the phase that takes
  /// its values through their graph trains there). Null or false for all: the run records
  /// no graph.
  std::function<bool(const std::string &)> records;
};

/// One rank's executor of every phase in a plan.
class PhaseExecutor {
public:
  virtual ~PhaseExecutor() = default;
  /// Runs the phase with key `phase` ("d", or "d@8x8" in a stage) on the inputs `inputs`
  /// makes (once per micro-batch when it accumulates) and returns its local loss, the mean
  /// over micro-batches (on the device; reading it synchronises).
  virtual at::Tensor run(const std::string &phase, const InputFn &inputs, const StepFn &step) = 0;
  /// Before a step, the keys of the phases it will run, in the order run() is called for
  /// them. An executor may then defer their work and launch it at once at the last call
  /// (CUDA step graphs): a run's loss, statistics and gradients are then ready only after
  /// the step's last run() returned, on the device's stream order.
  virtual void beginStep(const std::vector<std::string> & /*phases*/) {}
  /// After a step's phases and sections are all issued (run() and runSection() called for
  /// each): an executor that captured the step's phases together ends the capture here and
  /// runs it. Gradients and logged values of the step are read after this.
  virtual void endStep() {}
  /// Runs a section's method on the inputs `inputs` makes for micro-batch `micro` and
  /// returns the dict it returned: its values, with their graph where `call` records one.
  /// On CUDA, where the step's phases share values and are captured together, the section
  /// is part of that graph and the values are the graph's, at fixed addresses.
  virtual c10::impl::GenericDict runSection(const SectionCall &call, const InputFn &inputs,
                                            int64_t micro) = 0;
  /// How the phase runs ("eager", "cuda-graph", or "eager (reason)").
  virtual std::string mode(const std::string &phase) const = 0;
  virtual const PhaseReducer &reducer(const std::string &phase) const = 0;
  /// Statistics of the last run.
  const RunStats &lastRun() const { return lastRun_; }
  /// Copies rank 0's parameters and buffers to every rank (once, at start-up).
  virtual void broadcastState() = 0;
  /// Every parameter of the model by qualified name (the tensors the phases train).
  virtual const std::map<std::string, at::Tensor> &parameters() const = 0;
  /// Bytes of gradient buffers this rank holds for the reducers: every phase's buckets, or,
  /// sharded, the one scratch the phases share.
  virtual int64_t gradientBufferBytes() const = 0;
  /// The captured graphs' shapes (what each replay's launch submits); empty where no phase
  /// is captured (CPU, --cuda-graphs off, eager phases).
  virtual GraphShapes graphShapes() const { return {}; }
  /// Host seconds the last run spent in the model's forward and backward and in all-reduce
  /// waits (on CPU that is the work; on CUDA the work is timed on the device instead).
  double lastWorkSeconds() const { return lastWorkSeconds_; }
  /// The values the last run's phase method logged besides its loss (a method returning
  /// `(loss, {name: scalar})`), in the method's order, each the mean over micro-batches, on
  /// the device (reading one synchronises).
  const std::vector<std::pair<std::string, at::Tensor>> &lastStats() const { return lastStats_; }
  /// The values the last run's method handed on (its plan phase's `outputs`), per
  /// micro-batch, detached.
  const std::vector<std::map<std::string, at::Tensor>> &lastOutputs() const { return lastOutputs_; }

protected:
  std::vector<std::map<std::string, at::Tensor>> lastOutputs_;
  double lastWorkSeconds_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> lastStats_;
  RunStats lastRun_;
};

/// Makes the executor for `options.device`: the eager executor on CPU (Gloo), the CUDA
/// Graph executor on a GPU (NCCL). The runtime names no backend beyond this.
Expected<std::unique_ptr<PhaseExecutor>> createExecutor(const ir::Module &plan,
                                                        torch::jit::Module module,
                                                        c10::intrusive_ptr<c10d::Backend> group,
                                                        const ExecutorOptions &options);

/// True when this build has the CUDA backend and a GPU is visible.
bool cudaAvailable();

} // namespace ganc::backend
