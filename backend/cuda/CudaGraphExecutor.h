// The CUDA backend: each phase (forward, backward, NCCL bucket all-reduces, optimizer step)
// warmed up eagerly, captured once into a CUDA Graph, then replayed (optionally a whole step,
// its phase graphs as child graphs, at one launch). A step whose phases share values is
// captured as one graph, its sections included.
#pragma once

#include "backend/cpu/EagerExecutor.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <set>
#include <stdexcept>

namespace ganc::backend {

struct RngOnDevice;
class StepGraph;

/// Runs a plan's phases on one GPU per rank. The bucket all-reduces are the PhaseReducer's,
/// launched from post-accumulate hooks through c10d's ProcessGroupNCCL, which runs NCCL on its
/// own stream joined to the compute stream by events, so they overlap the rest of backward
/// and become graph edges when captured. Phases the capture-safety pass marked eager run
/// eagerly, with the reason logged once.
class CudaGraphExecutor : public PhaseExecutor {
public:
  static Expected<std::unique_ptr<CudaGraphExecutor>>
  create(const ir::Module &plan, torch::jit::Module module, c10::intrusive_ptr<c10d::Backend> group,
         const ExecutorOptions &options);
  ~CudaGraphExecutor() override;

  void beginStep(const std::vector<std::string> &phases) override;
  void endStep() override;
  at::Tensor run(const std::string &phase, const InputFn &inputs, const StepFn &step) override;
  c10::impl::GenericDict runSection(const SectionCall &call, const InputFn &inputs,
                                    int64_t micro) override;
  std::string mode(const std::string &phase) const override;
  const PhaseReducer &reducer(const std::string &phase) const override;
  void broadcastState() override { eager_->broadcastState(); }
  int64_t gradientBufferBytes() const override { return eager_->gradientBufferBytes(); }
  GraphShapes graphShapes() const override;
  const std::map<std::string, at::Tensor> &parameters() const override {
    return eager_->parameters();
  }

private:
  struct Captured;
  struct Linked;
  /// At the first call of a linked step (see Linked; a replay's first phase): launches its
  /// graph if captured (returning the launch's host seconds), else joins the side stream and,
  /// after the warm-ups, begins the capture.
  double startLinked();
  /// A call of a linked step that runs eagerly on the side stream (warm-up or capture);
  /// during capture a failure ends the capture and names the step's phases.
  template <typename F> auto onSide(F &&work);
  /// A linked step's capture failed with `e`: drops the graph and returns the error naming
  /// the step's phases.
  static std::runtime_error linkedCaptureFailed(Linked &l, const std::exception &e);
  /// run() of a phase in a linked step: a warm-up or captured run on the side stream, or the
  /// kept outputs of the graph (launched at the step's first phase).
  at::Tensor runLinked(const std::string &phase, const InputFn &inputs, const StepFn &step);
  /// run() of a phase in a step graph (beginStep): its kept outputs, and the step's one
  /// launch at its last phase.
  at::Tensor runInStepGraph(const std::string &phase);
  /// Why the phases of the step `phases` that share values run eagerly ("" if they are
  /// captured together).
  std::string linkedEagerReason(const std::vector<std::string> &phases) const;
  CudaGraphExecutor() = default;
  std::unique_ptr<EagerExecutor> eager_;
  ExecutorOptions options_;
  std::map<std::string, std::unique_ptr<Captured>> phases_;
  std::set<std::string> loggedEager_;
  /// Warm-up and capture run here (capture cannot start on the legacy default stream).
  std::unique_ptr<c10::cuda::CUDAStream> side_;
  /// One memory pool for every captured phase: phases never run concurrently, and replay
  /// order on the one stream keeps their temporaries apart in time.
  at::cuda::MempoolId_t pool_{0, 0};
  /// What the replays have left in the generators' device tensors (see PhaseGraph).
  std::unique_ptr<RngOnDevice> rng_;
  /// --cuda-graphs step: one graph per sequence of phases a step ran (null: it could not be
  /// built), keyed by the phase keys; the current step's, its phases (the key) and the next
  /// to run.
  std::map<std::vector<std::string>, std::unique_ptr<StepGraph>> stepGraphs_;
  StepGraph *step_ = nullptr;
  const std::vector<std::string> *stepPhases_ = nullptr;
  size_t stepNext_ = 0;
  /// Steps whose phases share values: one graph per sequence of phases a step ran, keyed by
  /// the phase keys; the current step's (null where its phases share nothing, or run
  /// eagerly), whether its first call came, and the sections run so far.
  std::map<std::vector<std::string>, std::unique_ptr<Linked>> linked_;
  Linked *linkedStep_ = nullptr;
  bool linkedStarted_ = false;
  size_t linkedSections_ = 0;
  /// The phases sharing values that run eagerly this step, and why (logged once per phase).
  std::string linkedEager_;
};

} // namespace ganc::backend
