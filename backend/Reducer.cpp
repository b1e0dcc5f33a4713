// Bucketed all-reduce of one phase's gradients, launched from post-accumulate hooks.
#include "backend/Reducer.h"

#include "support/torch/Collectives.h"
#include "support/torch/Dtypes.h"

#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace ganc::backend {

Expected<std::unique_ptr<PhaseReducer>>
PhaseReducer::create(const ir::Phase &phase, const std::map<std::string, at::Tensor> &parameters,
                     c10::intrusive_ptr<c10d::Backend> group, c10::Device device, int zeroStage,
                     const std::map<c10::ScalarType, at::Tensor> *scratch, bool keepGradients,
                     bool onComputeStream) {
  auto r = std::unique_ptr<PhaseReducer>(new PhaseReducer());
  r->asyncCollectives_ = !onComputeStream;
  r->group_ = group;
  r->rank_ = group->getRank();
  r->world_ = group->getSize();
  r->scale_ = 1.0 / static_cast<double>(group->getSize());
  r->keepGradients_ = keepGradients;
  if (zeroStage > 0 && r->world_ > 1) {
    r->zero_ = zeroStage;
    for (const ir::Bucket &bucket : phase.buckets)
      if (bucket.shardBytes == 0)
        return Status::error("phase '" + phase.name +
                             "': the plan's buckets have no shard layout "
                             "for " +
                             std::to_string(r->world_) + " ranks");
    r->bucketShards_.resize(phase.buckets.size());
    if (!scratch)
      return Status::error("phase '" + phase.name + "': a sharded reducer needs scratch buffers");
  }
  // Sharded: buffers are carved from the scratch, every bucket's first, then the shards.
  std::map<c10::ScalarType, int64_t> carved;
  auto carve = [&](c10::ScalarType dtype, int64_t elements) {
    int64_t &offset = carved[dtype];
    at::Tensor view = scratch->at(dtype).narrow(0, offset, elements);
    offset += elements;
    return view;
  };
  for (size_t b = 0; b < phase.buckets.size(); ++b) {
    const ir::Bucket &bucket = phase.buckets[b];
    auto bucketType = scalarTypeOf(bucket.dtype);
    if (!bucketType)
      return bucketType.status().withContext("phase '" + phase.name + "', bucket " +
                                             std::to_string(b));
    const c10::ScalarType dtype = *bucketType;
    int64_t elementSize = static_cast<int64_t>(c10::elementSize(dtype));
    at::Tensor flat = r->zero_ ? carve(dtype, bucket.shardBytes * r->world_ / elementSize)
                               : torch::zeros({bucket.bytes / elementSize},
                                              at::TensorOptions(dtype).device(device));
    GANC_TRY(r->bindBucket(phase, b, parameters, flat));
  }
  if (r->zero_)
    for (size_t b = 0; b < phase.buckets.size(); ++b) {
      const c10::ScalarType dtype = r->buffers_[b].scalar_type();
      const int64_t shard =
          phase.buckets[b].shardBytes / static_cast<int64_t>(c10::elementSize(dtype));
      // This rank's shard of the bucket: the reduce-scatter's output (in place) and the
      // all-gather's input. Kept apart only when the gradients must outlive the gather.
      at::Tensor own = r->buffers_[b].narrow(0, r->rank_ * shard, shard);
      r->gradShards_.push_back(keepGradients ? carve(dtype, shard) : own);
      GANC_TRY(r->createShards(phase, parameters, dtype, b));
    }
  for (const ir::ScheduledAllReduce &s : phase.schedule)
    r->scheduleOrder_.push_back(s.bucket);
  for (const std::string &name : phase.used) {
    r->slots_.at(name).used = r->usedNames_.size();
    r->usedNames_.push_back(name);
    r->usedParameters_.push_back(parameters.at(name));
  }
  r->conditional_ = phase.conditional;
  r->pending_.assign(r->buffers_.size(), 0);
  r->staged_.resize(r->buffers_.size());
  return r;
}

Status PhaseReducer::bindBucket(const ir::Phase &phase, size_t b,
                                const std::map<std::string, at::Tensor> &parameters,
                                const at::Tensor &flat) {
  const ir::Bucket &bucket = phase.buckets[b];
  const c10::ScalarType dtype = flat.scalar_type();
  const int64_t elementSize = static_cast<int64_t>(c10::elementSize(dtype));
  for (const ir::Bucket::Slot &slot : bucket.slots) {
    auto it = parameters.find(slot.parameter);
    if (it == parameters.end())
      return Status::error("phase '" + phase.name + "': the plan's parameter '" + slot.parameter +
                           "' does not exist in the model");
    const at::Tensor &p = it->second;
    if (p.scalar_type() != dtype || p.nbytes() != static_cast<size_t>(slot.bytes))
      return Status::error("phase '" + phase.name + "': parameter '" + slot.parameter + "' has " +
                           std::to_string(p.nbytes()) + " bytes of " +
                           std::string(c10::toString(p.scalar_type())) + " in the model but " +
                           std::to_string(slot.bytes) + " bytes of " + bucket.dtype +
                           " in the plan");
    if (zero_) {
      slots_[slot.parameter] = Slot{static_cast<int>(b), at::Tensor()};
      continue;
    }
    // The slot has the parameter's strides (as DDP's bucket views do), so a channels-last
    // weight gets a channels-last gradient and the fused optimizers see one layout.
    at::Tensor view = p.is_non_overlapping_and_dense()
                          ? flat.as_strided(p.sizes(), p.strides(), slot.offset / elementSize)
                          : flat.narrow(0, slot.offset / elementSize, p.numel()).view(p.sizes());
    slots_[slot.parameter] = Slot{static_cast<int>(b), view};
  }
  buffers_.push_back(flat);
  slotsPerBucket_.push_back(static_cast<int>(bucket.slots.size()));
  return Status::ok();
}

void PhaseReducer::prepare(const std::map<std::string, at::Tensor> &parameters) {
  // Every .grad starts undefined, so AccumulateGrad steals backward's fresh gradient instead
  // of adding into a zeroed buffer; the bucket's writes then put it in its slot scaled by
  // 1/world (DDP's mul_out into its bucket views, the same products). Nothing is zeroed here.
  for (const auto &[name, tensor] : parameters) {
    at::Tensor p = tensor;
    p.mutable_grad() = at::Tensor();
  }
  for (Staged &staged : staged_)
    staged.clear();
  pending_ = slotsPerBucket_;
  for (auto &[name, slot] : slots_)
    ready_[name] = false;
  nextLaunch_ = 0;
  works_.clear();
}

bool PhaseReducer::markReady(const std::string &parameter, const at::Tensor &tensor) {
  auto slot = slots_.find(parameter);
  if (slot == slots_.end())
    return false;
  bool &ready = ready_[parameter];
  if (ready)
    return true; // a second backward in one phase: the bucket has already gone
  at::Tensor p = tensor;
  const at::Tensor grad = p.grad();
  if (zero_) {
    // The gradient goes into every rank's piece of the bucket and is then let go: the
    // averaged gradient this rank keeps is its shard's, after the collective.
    stagePieces(parameter, grad);
    p.mutable_grad() = at::Tensor();
  } else {
    stage(slot->second, p);
  }
  ready = true;
  if (timeline_)
    timeline_->mark(timeline_->parameter(slot->second.used));
  if (--pending_[slot->second.bucket] == 0) {
    writeBucket(slot->second.bucket);
    if (timeline_)
      timeline_->mark(timeline_->bucket(slot->second.bucket));
    launchReady();
  }
  return true;
}

void PhaseReducer::stage(const Slot &slot, const at::Tensor &parameter) {
  at::Tensor p = parameter;
  const at::Tensor grad = p.grad();
  if (grad.defined() && !grad.is_same(slot.view)) {
    Staged &staged = staged_[slot.bucket];
    staged.grads.push_back(grad);
    staged.views.push_back(slot.view);
    staged.parameters.push_back(p);
  } else {
    p.mutable_grad() = slot.view;
  }
}

void PhaseReducer::writeBucket(int bucket) {
  Staged &staged = staged_[bucket];
  if (staged.grads.empty())
    return;
  // One multi-tensor copy for the bucket's gradients (sharded: their pieces), then one
  // multi-tensor scale by 1/world (skipped at world size 1, where it is exact): a kernel or
  // two per bucket on a GPU, where a copy per parameter would be one kernel launch (and one
  // graph node) each. Either way every element is grad * (1/world) in the gradient's own
  // precision, as DDP's mul_out.
  torch::NoGradGuard noGrad;
  at::_foreach_copy_(staged.views, staged.grads);
  if (scale_ != 1.0)
    at::_foreach_mul_(staged.views, at::Scalar(scale_));
  for (size_t i = 0; i < staged.parameters.size(); ++i)
    staged.parameters[i].mutable_grad() = staged.views[i];
  staged.clear();
}

void PhaseReducer::launchReady() {
  // Collectives must be issued in the same order on every rank: bucket k+1 goes only after
  // bucket k, even if it completes first.
  while (nextLaunch_ < scheduleOrder_.size() && pending_[scheduleOrder_[nextLaunch_]] == 0) {
    const int b = scheduleOrder_[nextLaunch_];
    if (zero_ == 2) {
      works_.push_back(group_->_reduce_scatter_base(
          gradShards_[b], buffers_[b], collectiveOptions<c10d::ReduceScatterOptions>()));
    } else {
      std::vector<at::Tensor> tensors{buffers_[b]};
      works_.push_back(group_->allreduce(tensors, collectiveOptions<c10d::AllreduceOptions>()));
    }
    ++nextLaunch_;
  }
}

void PhaseReducer::finish(const std::map<std::string, at::Tensor> &parameters) {
  // A gradient that did not arrive in this backward: one summed locally by earlier
  // micro-batches (their hooks were off) goes into its slot now; one this rank never computed
  // (a branch not taken) counts as zeros, since the slot still holds an earlier run's values.
  std::set<std::string> reachedHere;
  for (auto &[name, ready] : ready_) {
    Slot &slot = slots_.at(name);
    at::Tensor p = parameters.at(name);
    if (ready) {
      reachedHere.insert(name);
      continue;
    }
    const at::Tensor grad = p.grad();
    if (grad.defined())
      reachedHere.insert(name);
    if (zero_) {
      if (grad.defined())
        stagePieces(name, grad);
      else
        zeroGradient(name);
      p.mutable_grad() = at::Tensor();
    } else if (grad.defined()) {
      stage(slot, p);
    } else {
      slot.view.zero_();
      p.mutable_grad() = slot.view;
    }
    if (timeline_)
      timeline_->mark(timeline_->parameter(slot.used));
  }
  for (size_t b = 0; b < pending_.size(); ++b)
    if (pending_[b] != 0) {
      writeBucket(static_cast<int>(b));
      if (timeline_)
        timeline_->mark(timeline_->bucket(b));
      pending_[b] = 0;
    }
  launchReady();
  // Which conditional parameters some rank reached: one small all-reduce, issued after every
  // bucket, so every rank issues its collectives in the same order.
  at::Tensor reached;
  if (!conditional_.empty()) {
    std::vector<float> flags;
    for (const std::string &name : conditional_)
      flags.push_back(reachedHere.count(name) ? 1.0F : 0.0F);
    reached = torch::tensor(flags).to(buffers_.front().device());
    std::vector<at::Tensor> tensors{reached};
    works_.push_back(group_->allreduce(tensors, collectiveOptions<c10d::AllreduceOptions>()));
  }
  for (auto &work : works_)
    waitFor(work);
  works_.clear();
  if (zero_ == 1 && keepGradients_) // every rank has the whole averaged bucket
    for (size_t b = 0; b < buffers_.size(); ++b)
      gradShards_[b].copy_(buffers_[b].narrow(0, rank_ * shardElements_[b], shardElements_[b]));
  // No rank reached it: grad None and no step, as DDP(find_unused_parameters=True) leaves it.
  unreached_.clear();
  if (reached.defined()) {
    const at::Tensor counts = reached.cpu();
    const float *count = counts.data_ptr<float>();
    for (size_t i = 0; i < conditional_.size(); ++i)
      if (count[i] == 0) {
        unreached_.insert(conditional_[i]);
        at::Tensor p = parameters.at(conditional_[i]);
        p.mutable_grad() = at::Tensor();
      }
  }
}

Expected<std::map<c10::ScalarType, int64_t>>
PhaseReducer::scratchElements(const ir::Phase &phase, int64_t ranks, bool keepGradients) {
  std::map<c10::ScalarType, int64_t> elements;
  for (size_t b = 0; b < phase.buckets.size(); ++b) {
    const ir::Bucket &bucket = phase.buckets[b];
    auto dtype = scalarTypeOf(bucket.dtype);
    if (!dtype)
      return dtype.status().withContext("phase '" + phase.name + "', bucket " + std::to_string(b));
    elements[*dtype] += bucket.shardBytes * (ranks + (keepGradients ? 1 : 0)) /
                        static_cast<int64_t>(c10::elementSize(*dtype));
  }
  return elements;
}

at::Tensor flatView(const at::Tensor &t) {
  return t.as_strided({t.numel()}, {1}, t.storage_offset());
}

Status PhaseReducer::createShards(const ir::Phase &phase,
                                  const std::map<std::string, at::Tensor> &parameters,
                                  c10::ScalarType dtype, size_t b) {
  const ir::Bucket &bucket = phase.buckets[b];
  const int64_t elementSize = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t shardElements = bucket.shardBytes / elementSize;
  shardElements_.push_back(shardElements);
  for (const ir::Bucket::Slot &slot : bucket.slots) {
    // Detached: the optimizer and the all-gather write the parameter through these views.
    const at::Tensor p = parameters.at(slot.parameter).detach();
    if (!p.is_non_overlapping_and_dense())
      return Status::error("phase '" + phase.name + "': parameter '" + slot.parameter +
                           "' is not dense in memory (a view of another tensor?); sharded "
                           "optimizer state splits parameters by their memory");
    Shard shard;
    shard.bucket = static_cast<int>(b);
    shard.offset = slot.shardOffset / elementSize;
    shard.parameter = p;
    const at::Tensor flat = flatView(p);
    for (int q = 0; q < world_; ++q) {
      const ir::Piece piece = ir::pieceOf(p.numel(), world_, q);
      shard.pieces.push_back(piece);
      shard.paramPieces.push_back(flat.narrow(0, piece.begin, piece.length));
      shard.bucketPieces.push_back(
          buffers_[b].narrow(0, q * shardElements + shard.offset, piece.length));
    }
    const int64_t mine = shard.pieces[rank_].length;
    shard.param = shard.paramPieces[rank_];
    shard.grad = gradShards_[b].narrow(0, shard.offset, mine);
    shards_[slot.parameter] = std::move(shard);
  }
  for (const ir::Bucket::Slot &slot : bucket.slots)
    bucketShards_[b].push_back(&shards_.at(slot.parameter));
  return Status::ok();
}

void PhaseReducer::stagePieces(const std::string &parameter, const at::Tensor &grad) {
  Shard &shard = shards_.at(parameter);
  // The pieces are the parameter's memory order: a gradient with other strides is first
  // laid out like the parameter.
  at::Tensor g = grad;
  if (g.strides() != shard.parameter.strides())
    g = at::empty_strided(shard.parameter.sizes(), shard.parameter.strides(), g.options())
            .copy_(grad);
  const at::Tensor flat = flatView(g);
  Staged &staged = staged_[shard.bucket];
  for (int q = 0; q < world_; ++q) {
    staged.grads.push_back(flat.narrow(0, shard.pieces[q].begin, shard.pieces[q].length));
    staged.views.push_back(shard.bucketPieces[q]);
  }
}

void PhaseReducer::zeroGradient(const std::string &parameter) {
  for (at::Tensor &piece : shards_.at(parameter).bucketPieces)
    piece.zero_();
}

void PhaseReducer::gatherBucket(int bucket) {
  torch::NoGradGuard noGrad;
  // The updated pieces go into this rank's shard of the bucket (its gradient is spent),
  // which the all-gather reads in place.
  for (Shard *shard : bucketShards_[bucket])
    shard->bucketPieces[rank_].copy_(shard->param);
  at::Tensor own =
      buffers_[bucket].narrow(0, rank_ * shardElements_[bucket], shardElements_[bucket]);
  works_.push_back(
      group_->_allgather_base(buffers_[bucket], own, collectiveOptions<c10d::AllgatherOptions>()));
  gathering_.push_back(bucket);
}

void PhaseReducer::finishGather() {
  torch::NoGradGuard noGrad;
  for (size_t i = 0; i < works_.size(); ++i) {
    waitFor(works_[i]);
    for (Shard *shard : bucketShards_[gathering_[i]])
      for (int q = 0; q < world_; ++q)
        if (q != rank_)
          shard->paramPieces[q].copy_(shard->bucketPieces[q]);
  }
  works_.clear();
  gathering_.clear();
}

std::vector<at::Tensor> PhaseReducer::gatherGradients() const {
  torch::NoGradGuard noGrad;
  std::vector<at::Tensor> whole;
  for (size_t i = 0; i < usedNames_.size(); ++i) {
    const Shard &shard = shards_.at(usedNames_[i]);
    const at::Tensor &p = shard.parameter;
    whole.push_back(at::empty_strided(p.sizes(), p.strides(), p.options()));
  }
  for (size_t b = 0; b < buffers_.size(); ++b) {
    at::Tensor gathered = torch::empty_like(buffers_[b]);
    at::Tensor input = gradShards_[b];
    waitFor(group_->_allgather_base(gathered, input));
    for (size_t i = 0; i < usedNames_.size(); ++i) {
      const Shard &shard = shards_.at(usedNames_[i]);
      if (shard.bucket != static_cast<int>(b))
        continue;
      const at::Tensor flat = flatView(whole[i]);
      for (int q = 0; q < world_; ++q)
        flat.narrow(0, shard.pieces[q].begin, shard.pieces[q].length)
            .copy_(
                gathered.narrow(0, q * shardElements_[b] + shard.offset, shard.pieces[q].length));
    }
  }
  return whole;
}

struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
  GradReadyHook(GradReadyHooks *owner, std::string name) : owner(owner), name(std::move(name)) {}
  void operator()(const torch::autograd::Variable &tensor) override { owner->fire(name, tensor); }
  GradReadyHooks *owner;
  std::string name;
};

GradReadyHooks::GradReadyHooks(const std::map<std::string, at::Tensor> &parameters) {
  for (const auto &[name, tensor] : parameters) {
    torch::autograd::impl::set_post_acc_grad_hooks(tensor,
                                                   std::make_unique<GradReadyHook>(this, name));
    tensors_.push_back(tensor);
  }
}

GradReadyHooks::~GradReadyHooks() {
  for (const at::Tensor &t : tensors_)
    torch::autograd::impl::post_acc_grad_hooks(t).reset();
}

void GradReadyHooks::setActive(PhaseReducer *reducer) { active_ = reducer; }

void GradReadyHooks::fire(const std::string &name, const at::Tensor &tensor) {
  // A double-backward graph can hand a parameter's AccumulateGrad an undefined gradient (a
  // path that carries none: StyleGAN-style path length through a traced synthesis network);
  // its .grad stays undefined, as in eager PyTorch, so it is not a gradient the plan missed.
  if (active_ && !active_->markReady(name, tensor) && tensor.grad().defined())
    unexpected_.push_back(name);
}

} // namespace ganc::backend
