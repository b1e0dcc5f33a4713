// The eager executor: each phase's method under autograd, all-reduces launched from hooks.
#pragma once

#include "backend/Executor.h"

namespace ganc::backend {

/// Runs each phase eagerly with autograd; bucket all-reduces overlap backward through the
/// process group's own threads (Gloo) or streams (NCCL). Used on CPU, and on CUDA for phases
/// the capture-safety pass marked eager.
class EagerExecutor : public PhaseExecutor {
public:
  static Expected<std::unique_ptr<EagerExecutor>> create(const ir::Module &plan,
                                                         torch::jit::Module module,
                                                         c10::intrusive_ptr<c10d::Backend> group,
                                                         const ExecutorOptions &options);
  ~EagerExecutor() override;

  at::Tensor run(const std::string &phase, const InputFn &inputs, const StepFn &step) override;
  c10::impl::GenericDict runSection(const SectionCall &call, const InputFn &inputs,
                                    int64_t micro) override;
  std::string mode(const std::string &phase) const override;
  const PhaseReducer &reducer(const std::string &phase) const override;

  /// Forward and backward of micro-batch `micro` of a phase, under its autocast; the last
  /// micro-batch's backward launches the all-reduces and waits for them. Returns the
  /// micro-batch's loss divided by the phase's accumulate count, detached.
  at::Tensor forwardBackward(const std::string &phase, const std::vector<at::Tensor> &inputs,
                             int64_t micro);
  /// Copies rank 0's buffers to every rank (all of them, grouped by dtype).
  void broadcastBuffers();
  void broadcastState() override;
  const std::map<std::string, at::Tensor> &parameters() const override { return parameters_; }
  int64_t gradientBufferBytes() const override;
  torch::jit::Module &module() { return module_; }
  /// The timed last run of `phase` (ExecutorOptions::profile): on a GPU this waits for the
  /// device. The CPU's run() fills lastRun() with it itself; on CUDA the caller reads it
  /// only where the run executed (not a capture).
  RunStats timedRun(const std::string &phase) const;

private:
  struct PhaseState {
    const ir::Phase *plan = nullptr;
    /// The stage-specialised graph, or null to run the plan's method.
    std::unique_ptr<torch::jit::GraphFunction> function;
    std::unique_ptr<PhaseReducer> reducer;
    std::vector<std::pair<at::Tensor, bool>> requiresGrad;
    std::unique_ptr<RunTimeline> timeline; // when profiling
    /// The joint graph the phase runs instead of its method and autograd (--executor joint).
    std::shared_ptr<const JointProgram> joint;
    /// Its graph's parameters and buffers by name (the executor's own tensors, made once);
    /// each run adds the phase's inputs and the seed.
    std::map<std::string, at::Tensor> jointInputs;
    /// The dtypes of its graph's seed port and of its loss, read off the graph once.
    c10::ScalarType seedType = at::kFloat, lossType = at::kFloat;
  };
  EagerExecutor() = default;
  void broadcastCoalesced(std::vector<at::Tensor> tensors);
  /// The phase method (or its stage graph) on `inputs`, under the phase's autocast.
  /// The phase method's output: its loss, or (loss, {name: scalar}).
  c10::IValue forward(PhaseState &state, const std::vector<at::Tensor> &inputs);
  /// forwardBackward through the phase's joint graph: each gradient accumulated into .grad
  /// as autograd's AccumulateGrad does, and handed to the reducer (last micro-batch) as soon
  /// as the op completing it has run.
  at::Tensor jointForwardBackward(PhaseState &state, const std::vector<at::Tensor> &inputs,
                                  int64_t micro);
  /// The loss's gradient a joint graph is seeded with: what autograd seeds it with in eager's
  /// (loss / accumulate * scale).backward(), in the dtype of the graph's seed port.
  at::Tensor jointSeed(const PhaseState &state) const;
  /// The dtypes of a joint phase's seed port and of its loss, read off its graph once.
  static Status readSeedTypes(PhaseState &state);

  torch::jit::Module module_;
  c10::intrusive_ptr<c10d::Backend> group_;
  ExecutorOptions options_;
  std::map<std::string, at::Tensor> parameters_;
  std::vector<at::Tensor> buffers_;
  std::map<std::string, at::Tensor> buffersByName_;
  std::map<std::string, PhaseState> phases_;
  /// Sharded plans: the reducers' buffers, shared by the phases (see PhaseReducer::create).
  std::map<c10::ScalarType, at::Tensor> scratch_;
  std::unique_ptr<GradReadyHooks> hooks_;
};

} // namespace ganc::backend
