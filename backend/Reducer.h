// Bucketed gradient all-reduce for one phase of a plan: flat buffers, .grad views, hooks.
#pragma once

#include "backend/Timeline.h"
#include "ir/Module.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace ganc::backend {

/// Runs the all-reduces of one phase exactly as its plan says. Each bucket is one flat
/// buffer. When backward completes the last gradient of a bucket, the bucket's gradients are
/// written into their parameters' slots scaled by 1/world (as DDP does, but a bucket at a
/// time: multi-tensor kernels, not one per parameter), each parameter's `.grad` becomes a view
/// of its slot, and the bucket is all-reduced with SUM, in the plan's schedule order, while
/// the rest of backward goes on. The optimizer then reads the averaged gradients straight
/// from the buckets.
class PhaseReducer {
public:
  /// `parameters` maps every module parameter name to its tensor; `device` is where the
  /// buffers live.
  /// `zeroStage` (1 or 2) shards as the plan's buckets lay out when the plan is sharded.
  /// Sharded, every buffer the reducer uses is scratch within one run of its phase (a
  /// bucket holds the gradients, this rank's averaged shard of them after the collective,
  /// then the gathered parameters), so it is carved from `scratch` (per dtype, at least
  /// scratchElements(phase) long), which the phases of a plan share: they run one after
  /// another. `keepGradients` keeps the averaged gradient shards apart, so they outlive the
  /// all-gather (for gatherGradients). `onComputeStream`: NCCL runs the collectives on the
  /// current stream instead of its own (ExecutorOptions::collectivesOnComputeStream).
  static Expected<std::unique_ptr<PhaseReducer>>
  create(const ir::Phase &phase, const std::map<std::string, at::Tensor> &parameters,
         c10::intrusive_ptr<c10d::Backend> group, c10::Device device, int zeroStage = 0,
         const std::map<c10::ScalarType, at::Tensor> *scratch = nullptr, bool keepGradients = false,
         bool onComputeStream = false);
  /// Sharded: the scratch elements one run of `phase` needs, per dtype.
  static Expected<std::map<c10::ScalarType, int64_t>>
  scratchElements(const ir::Phase &phase, int64_t ranks, bool keepGradients);

  /// Before backward: clear every parameter's .grad (unused parameters keep grad None, like
  /// DDP; used ones get their slot view when their gradient arrives).
  void prepare(const std::map<std::string, at::Tensor> &parameters);
  /// From a parameter's post-accumulate hook: its gradient for this backward is complete.
  /// Returns false when the plan does not expect a gradient for it.
  bool markReady(const std::string &parameter, const at::Tensor &tensor);
  /// After backward: zero the slots of gradients that never arrived, launch any bucket not
  /// launched yet (in order) and wait for all of them. For the plan's conditional
  /// parameters, one more small all-reduce says which some rank reached; the others get
  /// grad None (the optimizers skip them).
  void finish(const std::map<std::string, at::Tensor> &parameters);

  const std::vector<std::string> &usedNames() const { return usedNames_; }
  /// Whether usedNames()[i] got a gradient in the last run (false only for a conditional
  /// parameter no rank reached).
  bool hadGradient(size_t i) const { return !unreached_.count(usedNames_[i]); }
  const std::vector<at::Tensor> &usedParameters() const { return usedParameters_; }
  /// The all-reduced gradient of usedNames()[i]: its slot in the bucket, which the phase's
  /// last run wrote (a parameter's `.grad` may point at another phase's slot by now).
  /// Unsharded only (sharded, see gradientPiece and gatherGradients).
  const at::Tensor &gradient(size_t i) const { return slots_.at(usedNames_[i]).view; }
  /// The flat bucket buffers, in bucket order (read by tests and the CUDA backend).
  const std::vector<at::Tensor> &buffers() const { return buffers_; }
  /// Marks on `timeline` (null: none) when each used parameter's gradient is ready (as
  /// usedNames()) and when each bucket is written (by bucket index).
  void setTimeline(RunTimeline *timeline) { timeline_ = timeline; }

  // Sharded optimizer state (ZeRO). Each bucket is laid out by rank (ir::Bucket): backward's
  // gradients are written, scaled by 1/world, into every rank's piece; stage 1 all-reduces
  // the bucket, stage 2 reduce-scatters it; either way this rank is left the averaged
  // gradient of its own pieces, which the optimizer steps, and gatherBucket() then
  // all-gathers every rank's updated pieces back into the parameters.

  /// 0 (not sharded), 1 or 2.
  int zeroStage() const { return zero_; }
  /// This rank's piece of usedParameters()[i] (a 1-D view in its memory order; written in
  /// place by the optimizer) and the averaged gradient of that piece. Sharded only.
  const at::Tensor &parameterPiece(size_t i) const { return shards_.at(usedNames_[i]).param; }
  const at::Tensor &gradientPiece(size_t i) const { return shards_.at(usedNames_[i]).grad; }
  /// The bucket holding usedParameters()[i], and the order buckets are reduced (and are to be
  /// gathered) in: the same on every rank.
  int bucketOf(size_t i) const { return slots_.at(usedNames_[i]).bucket; }
  const std::vector<int> &launchOrder() const { return scheduleOrder_; }
  /// Once this rank's pieces in `bucket` are stepped: launches the bucket's all-gather
  /// (the optimizer can step the next bucket meanwhile). Every rank gathers every bucket, in
  /// launchOrder().
  void gatherBucket(int bucket);
  /// Waits for the all-gathers and copies the other ranks' pieces into the parameters.
  void finishGather();
  /// Every used parameter's averaged gradient, whole (an all-gather of the gradient pieces
  /// into fresh tensors; for dumps; the reducer must keep its gradients). Every rank calls
  /// it; index as usedNames().
  std::vector<at::Tensor> gatherGradients() const;

private:
  struct Slot {
    int bucket = 0;
    at::Tensor view;
    size_t used = 0; // its index in usedNames()
  };
  /// A used parameter's pieces when sharded: per rank q, its elements of the parameter and
  /// their place in the bucket (shard q); this rank's averaged gradient and its place in the
  /// all-gather's input.
  struct Shard {
    int bucket = 0;
    int64_t offset = 0; // elements from the start of each shard
    at::Tensor parameter;
    std::vector<ir::Piece> pieces;
    std::vector<at::Tensor> paramPieces, bucketPieces;
    at::Tensor param, grad;
  };
  /// Binds bucket b's slots to views of its flat buffer `flat` (sharded: records them; the
  /// shards bind later), after checking each parameter against the plan.
  Status bindBucket(const ir::Phase &phase, size_t b,
                    const std::map<std::string, at::Tensor> &parameters, const at::Tensor &flat);
  Status createShards(const ir::Phase &phase, const std::map<std::string, at::Tensor> &parameters,
                      c10::ScalarType dtype, size_t b);
  /// Holds `parameter`'s fresh gradient (its .grad) for its bucket's write; a gradient
  /// already in its slot only points .grad there.
  void stage(const Slot &slot, const at::Tensor &parameter);
  /// Sharded: holds the pieces of `parameter`'s gradient for its bucket's write into every
  /// rank's piece of the bucket.
  void stagePieces(const std::string &parameter, const at::Tensor &grad);
  /// Writes the held gradients of `bucket` into their slots (or pieces), scaled by 1/world,
  /// and points their parameters' .grad at the slots.
  void writeBucket(int bucket);
  void zeroGradient(const std::string &parameter);
  void launchReady();
  /// Options of a collective this reducer issues: on NCCL's own stream or the current one.
  template <typename Options> Options collectiveOptions() const {
    Options options;
    options.asyncOp = asyncCollectives_;
    return options;
  }

  c10::intrusive_ptr<c10d::Backend> group_;
  double scale_ = 1.0;
  std::vector<at::Tensor> buffers_;
  std::vector<int> scheduleOrder_; // bucket indices in launch order
  std::vector<int> slotsPerBucket_;
  std::vector<int> pending_; // gradients still to come, per bucket
  /// Per bucket: the gradients backward has completed, not yet written into the bucket,
  /// where each goes, and (unsharded) the parameters whose .grad then points there.
  struct Staged {
    std::vector<at::Tensor> grads, views, parameters;
    void clear() { // keeps the capacity: the next run stages as many
      grads.clear();
      views.clear();
      parameters.clear();
    }
  };
  std::vector<Staged> staged_;
  std::map<std::string, Slot> slots_;
  std::map<std::string, bool> ready_;
  std::vector<std::string> usedNames_;
  std::vector<std::string> conditional_;
  std::set<std::string> unreached_;
  std::vector<at::Tensor> usedParameters_;
  size_t nextLaunch_ = 0;
  RunTimeline *timeline_ = nullptr;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  int zero_ = 0;
  bool asyncCollectives_ = true; // c10d's asyncOp: NCCL's own stream
  int rank_ = 0;
  int world_ = 1;
  std::map<std::string, Shard> shards_;
  /// Sharded, per bucket: this rank's averaged gradient shard (its shard of the bucket,
  /// unless the gradients are kept).
  std::vector<at::Tensor> gradShards_;
  bool keepGradients_ = false;
  std::vector<int> gathering_; // buckets whose all-gather is in flight, in launch order
  std::vector<int64_t> shardElements_;
  std::vector<std::vector<Shard *>> bucketShards_;
};

/// `t` (non-overlapping and dense) as one flat view of its elements in memory order.
at::Tensor flatView(const at::Tensor &t);

/// Installs one post-accumulate-grad hook per parameter that forwards to whichever reducer
/// is active. The hook lives in the tensor's autograd metadata, so it keeps firing even
/// though autograd re-creates a parameter's AccumulateGrad node for every graph.
class GradReadyHooks {
public:
  explicit GradReadyHooks(const std::map<std::string, at::Tensor> &parameters);
  ~GradReadyHooks();
  void setActive(PhaseReducer *reducer);
  /// Names of parameters that produced a gradient the active plan did not expect.
  const std::vector<std::string> &unexpected() const { return unexpected_; }
  void clearUnexpected() { unexpected_.clear(); }

private:
  friend struct GradReadyHook;
  void fire(const std::string &name, const at::Tensor &tensor);
  std::vector<at::Tensor> tensors_;
  PhaseReducer *active_ = nullptr;
  std::vector<std::string> unexpected_;
};

} // namespace ganc::backend
