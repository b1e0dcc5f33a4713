#include "runtime/step/OptimizerStep.h"

#include "runtime/Session.h"
#include "support/torch/Collectives.h"

#include <algorithm>
#include <cmath>

namespace ganc::runtime {

const std::vector<OptimizerStep::StepGroup> &
OptimizerStep::groups(Session &s, const std::string &phase, const backend::PhaseReducer &reducer) {
  auto cached = cache_.find(phase);
  if (cached != cache_.end())
    return cached->second;
  // Per optimizer group, its used parameters in the model's order (the order of
  // parameters(), which clip_grad_norm_'s sum of norms follows).
  std::map<std::string, std::vector<std::pair<size_t, size_t>>> byGroup; // (model index, used)
  for (size_t i = 0; i < reducer.usedNames().size(); ++i) {
    const std::string &name = reducer.usedNames()[i];
    byGroup[s.groupOf.at(name)].emplace_back(s.parameterIndex.at(name), i);
  }
  const ir::Phase *compiled = s.plan->findPhase(phase);
  std::vector<StepGroup> groups;
  for (auto &[name, entries] : byGroup) {
    std::sort(entries.begin(), entries.end());
    StepGroup group;
    group.optimizer = &s.optimizers.at(name);
    for (const auto &[index, i] : entries) {
      group.names.push_back(reducer.usedNames()[i]);
      group.parameters.push_back(reducer.zeroStage() ? reducer.parameterPiece(i)
                                                     : reducer.usedParameters()[i]);
      group.used.push_back(i);
    }
    for (const ir::ClipGradNorm &clip : compiled->clips)
      if (clip.group == name)
        group.clip = &clip;
    if (reducer.zeroStage())
      for (size_t k = 0; k < group.used.size(); ++k) {
        StepGroup::Part &part = group.byBucket[reducer.bucketOf(group.used[k])];
        part.names.push_back(group.names[k]);
        part.parameters.push_back(group.parameters[k]);
        part.positions.push_back(k);
      }
    groups.push_back(std::move(group));
  }
  return cache_.emplace(phase, std::move(groups)).first->second;
}

std::vector<at::Tensor> OptimizerStep::gradients(const StepGroup &group,
                                                 const backend::PhaseReducer &reducer) {
  std::vector<at::Tensor> grads;
  for (size_t i : group.used)
    grads.push_back(!reducer.hadGradient(i) ? at::Tensor()
                    : reducer.zeroStage()   ? reducer.gradientPiece(i)
                                            : reducer.gradient(i));
  return grads;
}

void OptimizerStep::combineAcrossRanks(const Session &s, std::vector<at::Tensor> &found,
                                       std::vector<at::Tensor> &normParts, at::Tensor &squares,
                                       const std::vector<StepGroup> &groups) {
  // Each rank saw only its pieces: a flag set anywhere, and the norm over every rank's
  // pieces, must be the same on every rank before any of them steps.
  torch::NoGradGuard noGrad;
  auto options = at::TensorOptions(s.device).dtype(at::kDouble);
  std::vector<at::Tensor> sums, maxima;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (found[g].defined())
      sums.push_back(found[g].to(at::kDouble).reshape({1}));
    if (!groups[g].clip)
      continue;
    if (!normParts[g].defined())
      normParts[g] = torch::zeros({}, options);
    (std::isinf(groups[g].clip->normType) ? maxima : sums).push_back(normParts[g].reshape({1}));
  }
  sums.push_back(squares.to(at::kDouble).reshape({1})); // last
  auto allReduce = [&](std::vector<at::Tensor> &parts, c10d::ReduceOp op) {
    if (parts.empty())
      return at::Tensor();
    std::vector<at::Tensor> io{torch::cat(parts)};
    waitFor(s.group.backend->allreduce(io, c10d::AllreduceOptions{op}));
    return io[0];
  };
  at::Tensor summed = allReduce(sums, c10d::ReduceOp::SUM);
  at::Tensor maxed = allReduce(maxima, c10d::ReduceOp::MAX);
  int64_t nextSum = 0;
  int64_t nextMax = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (found[g].defined())
      found[g] = (summed[nextSum++] > 0).to(at::kFloat);
    if (groups[g].clip)
      normParts[g] = std::isinf(groups[g].clip->normType) ? maxed[nextMax++] : summed[nextSum++];
  }
  squares = summed[nextSum].to(at::kFloat);
}

namespace {

/// The sum of squares of every defined gradient of `grads` (a 0-d float32 tensor on `device`).
at::Tensor squaredNorm(const std::vector<std::vector<at::Tensor>> &grads, c10::Device device) {
  // Norms in float32 (half and bfloat16 gradients widened), float64 ones in float64.
  std::vector<at::Tensor> single, twice;
  for (const std::vector<at::Tensor> &group : grads)
    for (const at::Tensor &g : group)
      if (g.defined() && g.numel() > 0)
        (g.scalar_type() == at::kDouble ? twice : single).push_back(g);
  at::Tensor squares = torch::zeros({}, at::TensorOptions(device).dtype(at::kFloat));
  if (!single.empty())
    squares = squares + at::stack(at::_foreach_norm(single, 2, at::kFloat)).square().sum();
  if (!twice.empty())
    squares = squares + at::stack(at::_foreach_norm(twice, 2)).square().sum().to(at::kFloat);
  return squares;
}

} // namespace

void OptimizerStep::run(Session &s, const std::string &phase, backend::PhaseReducer &reducer) {
  const ir::Phase *compiled = s.plan->findPhase(phase);
  const std::string name = phase.substr(0, phase.find('@'));
  LossScaler *scaler =
      compiled->lossScaler.empty() ? nullptr : &s.lossScalers.at(compiled->lossScaler);
  const bool skip = scaler || s.options.nonFinite == "skip";
  const bool sharded = reducer.zeroStage() > 0;
  const std::vector<StepGroup> &groups = this->groups(s, phase, reducer);
  // GradScaler's order: unscale_(optimizer), clip, step(optimizer) (skipped on inf/NaN), and
  // update() once the phase's optimizers have stepped. Without a scaler, `skip` flags the
  // all-reduced gradients the same way (scale 1), so every rank skips the same steps.
  std::vector<std::vector<at::Tensor>> grads;
  std::vector<at::Tensor> found(groups.size()), normParts(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    grads.push_back(gradients(groups[g], reducer));
    if (scaler)
      found[g] = scaler->unscale(grads[g]);
    else if (skip)
      found[g] = nonFiniteFlag(grads[g], s.device);
    if (sharded && groups[g].clip)
      normParts[g] = localNormPart(grads[g], groups[g].clip->normType);
  }
  at::Tensor squares = squaredNorm(grads, s.device);
  if (sharded)
    combineAcrossRanks(s, found, normParts, squares, groups);
  {
    torch::NoGradGuard noGrad;
    s.gradNorms.at(name).copy_(squares.sqrt());
  }
  if (sharded) {
    for (size_t g = 0; g < groups.size(); ++g)
      if (groups[g].clip)
        scaleByNorm(grads[g], normParts[g], groups[g].clip->maxNorm, groups[g].clip->normType);
    // Bucket by bucket, in the order they were reduced: each bucket's all-gather is on its
    // way while the optimizers step the next one's pieces.
    for (int bucket : reducer.launchOrder()) {
      for (size_t g = 0; g < groups.size(); ++g) {
        auto part = groups[g].byBucket.find(bucket);
        if (part == groups[g].byBucket.end())
          continue;
        std::vector<at::Tensor> partGrads;
        for (size_t k : part->second.positions)
          partGrads.push_back(grads[g][k]);
        groups[g].optimizer->step(part->second.names, part->second.parameters, partGrads, found[g]);
      }
      reducer.gatherBucket(bucket);
    }
  } else {
    for (size_t g = 0; g < groups.size(); ++g) {
      const StepGroup &group = groups[g];
      if (group.clip)
        clipGradNorm(grads[g], group.clip->maxNorm, group.clip->normType);
      group.optimizer->step(group.names, group.parameters, grads[g], found[g]);
    }
  }
  std::vector<at::Tensor> flags;
  for (const at::Tensor &f : found)
    if (f.defined())
      flags.push_back(f);
  if (scaler)
    scaler->update(flags);
  if (!flags.empty()) {
    torch::NoGradGuard noGrad;
    s.skippedSteps.at(name).add_((torch::stack(flags).sum() > 0).to(torch::kLong));
  }
  if (sharded)
    reducer.finishGather();
}

} // namespace ganc::runtime
