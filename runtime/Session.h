// The state one rank trains with: plan, archive, device, process group, executor,
// optimizers and what the run has counted so far. Every room of runtime/ works on it;
// Setup.h makes it.
#pragma once

#include "backend/Executor.h"
#include "backend/JointProgram.h"
#include "frontend/Frontend.h"
#include "ir/Module.h"
#include "runtime/Options.h"
#include "runtime/Overrides.h"
#include "runtime/dist/Distributed.h"
#include "runtime/step/Controller.h"
#include "runtime/step/LossScaler.h"
#include "runtime/step/Optimizer.h"

#include <map>
#include <memory>
#include <string>

namespace ganc::runtime {

/// Everything the training loop works with, checked and ready; nothing trained yet.
struct Session {
  TrainOptions options;
  RankInfo rank;
  std::unique_ptr<ir::Module> plan;
  std::unique_ptr<frontend::Archive> archive;
  ProcessGroup group;
  c10::Device device = c10::kCPU;
  /// 4-D parameters, buffers and data batches are NHWC (--memory-format).
  bool channelsLast = false;
  /// The dtype of floating phase inputs (the spec's).
  c10::ScalarType inputType = c10::kFloat;
  std::unique_ptr<backend::PhaseExecutor> executor;
  /// One optimizer per optimizer group (the spec's `optimizers`, with loadArchive's defaults).
  std::map<std::string, Optimizer> optimizers;
  /// The plan's dynamic loss scalers by name.
  std::map<std::string, LossScaler> lossScalers;
  /// The spec's controllers (ADA's p) by name.
  std::map<std::string, Controller> controllers;
  /// The optimizer group that steps each used parameter.
  std::map<std::string, std::string> groupOf;
  /// Each parameter's position in the model's parameter order.
  std::map<std::string, size_t> parameterIndex;
  /// Per phase name, the steps whose optimizer step was skipped for non-finite gradients (by
  /// a loss scaler, or under `non_finite: skip`): an int64 device counter, read at log steps.
  std::map<std::string, at::Tensor> skippedSteps;
  /// Real images trained on so far, over every rank (what kimg counts), from step 0: kept in
  /// checkpoints, so a resumed run counts on.
  int64_t imagesSeen = 0;
  /// Per phase name, the L2 norm of its last run's all-reduced gradients, unscaled and before
  /// clipping (every rank's pieces, sharded): a 0-d float32 device tensor written in place by
  /// each step (inside a captured graph too), read at log steps (`GradNorm/<phase>`).
  std::map<std::string, at::Tensor> gradNorms;

  /// The best snapshot so far by the metric that ranks them (--metrics' first), kept in
  /// checkpoints; step -1 while there is none.
  struct Best {
    std::string metric;
    double value = 0;
    int64_t step = -1;
    /// The digest of the feature network that scored it (scores of two networks do not rank
    /// against each other); "" in checkpoints written before it was kept.
    std::string network;
  };
  Best best;
  /// The log interval a checkpoint cuts (it was written between log steps): the losses and
  /// logged values since the last log step, summed over the ranks, as JSON text ("": none).
  /// Kept in the checkpoint, so that the resumed run's next log line counts every step.
  std::string logInterval;
  /// The settings this run resumed with that differ from its checkpoint's, accepted with
  /// --accept-changes: by option, "now (was then)". run.json records them.
  std::map<std::string, std::string> acceptedChanges;
  /// The digest of the checkpoint this rank resumed from (0: none).
  uint64_t resumedDigest = 0;

  const frontend::Spec &spec() const { return archive->spec; }
  /// Real images one training step trains on over every rank (StyleGAN's batch): batch x
  /// ranks x the largest micro-batch count of the phases that read data.
  int64_t stepImages() const;
  /// How a phase of the spec trains (runtime::recipeOf of the plan).
  PhaseRecipe recipe(const frontend::PhaseSpec &phase, const std::string &stage = "") const {
    return recipeOf(phase, *plan, stage);
  }
  torch::jit::Module &module() { return archive->module; }
  /// The sample grid's graph, prepared (ganc's own archive, where the spec samples): the
  /// grids and the metrics draw through it in place of the module's code.
  std::shared_ptr<const backend::JointProgram> sampler;
  bool isRankZero() const { return rank.rank == 0; }
  /// Optimizer state is sharded across the ranks (a zero stage, more than one rank).
  bool sharded() const { return plan->shardRanks > 1; }
  /// Whether a phase's non-finite values are handled by skipping its step (a loss scaler,
  /// or `non_finite: skip`) rather than by stopping the run.
  bool skipsNonFinite(const std::string &phaseName) const;
  /// Bytes of optimizer state this rank holds, over every optimizer.
  int64_t optimizerStateBytes() const;
};

} // namespace ganc::runtime
