// ganc::sync_batch_norm: batch norm whose training statistics and backward sums are reduced
// over every rank, as torch.nn.SyncBatchNorm defines them.
//
// At one rank (or without a process group) it is batch norm itself (aten::batch_norm, with
// its double backward), as torch.nn.SyncBatchNorm falls back to F.batch_norm at world size 1.
// At more, it is torch.nn.SyncBatchNorm's forward and backward step for step
// (torch/nn/modules/_functions.py): each rank's per-channel mean and inverse standard
// deviation and its element count are all-gathered and merged rank by rank into the global
// statistics, which normalise the output and move the running statistics (towards the global
// mean and the unbiased global variance); backward all-reduces the per-channel sums of dy and
// dy * (x - mean), so the input gradient is that of batch norm over the global batch. On CUDA
// the five steps are SyncBatchNorm's own kernels (batch_norm_stats,
// batch_norm_gather_stats_with_counts, batch_norm_elemt, batch_norm_backward_reduce,
// batch_norm_backward_elemt), so the two agree bit for bit; on CPU, where those kernels do not
// exist, ATen expressions of the same arithmetic, so the CPU tests run the same steps.
// The weight and bias gradients stay local (the bucketed all-reduce averages them like any
// parameter's). Eval mode is plain batch norm with the running statistics.
#include "ops/Ops.h"

#include "support/torch/Collectives.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <mutex>

namespace ganc::ops {

namespace {

c10::intrusive_ptr<c10d::Backend> &syncGroup() {
  static c10::intrusive_ptr<c10d::Backend> group;
  return group;
}

bool distributed() { return syncGroup() && syncGroup()->getSize() > 1; }

/// The dimensions batch norm reduces over: all but the channel dimension 1.
std::vector<int64_t> reducedDims(const at::Tensor &x) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < x.dim(); ++d)
    dims.push_back(d);
  return dims;
}

/// A per-channel vector shaped to broadcast against x ([C] -> [1, C, 1, ...]).
at::Tensor perChannel(const at::Tensor &v, const at::Tensor &x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = x.size(1);
  return v.reshape(shape);
}

/// An optional tensor argument as a tensor (undefined when absent). Optional layer tensors
/// (an affine=False layer's weight and bias, a layer's running statistics without
/// track_running_stats) reach the autograd functions as std::optional: autograd refuses an
/// undefined at::Tensor argument.
at::Tensor orUndefined(const std::optional<at::Tensor> &t) { return t ? *t : at::Tensor(); }

/// Every rank's `local` ([n]) stacked in rank order ([world, n]); waited for at once (NCCL
/// runs it on the compute stream, so it can be captured).
at::Tensor allGather(const at::Tensor &local) {
  std::vector<std::vector<at::Tensor>> gathered(1);
  for (int r = 0; r < syncGroup()->getSize(); ++r)
    gathered[0].push_back(torch::empty_like(local));
  std::vector<at::Tensor> in{local};
  c10d::AllgatherOptions options;
  options.asyncOp = false;
  waitFor(syncGroup()->allgather(gathered, in, options));
  return torch::stack(gathered[0]);
}

/// Sums `t` over the ranks, in place; waited for at once.
void allReduce(at::Tensor &t) {
  std::vector<at::Tensor> io{t};
  c10d::AllreduceOptions options;
  options.asyncOp = false;
  waitFor(syncGroup()->allreduce(io, options));
}

/// The layout batch norm's CUDA kernels take: channels-last as it is, anything else
/// contiguous (what SyncBatchNorm does to its input and incoming gradient).
at::Tensor batchNormLayout(const at::Tensor &t) {
  if (t.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      t.is_contiguous(at::MemoryFormat::ChannelsLast3d))
    return t;
  return t.contiguous();
}

/// The type batch norm's kernels accumulate in: float64 for float64 inputs, float32 otherwise.
at::ScalarType accumulateType(const at::Tensor &x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

/// The five steps of torch.nn.SyncBatchNorm: its CUDA kernels on CUDA tensors, the same
/// arithmetic in ATen expressions on CPU ones.
namespace kernels {

/// batch_norm_stats: the per-channel mean and 1 / sqrt(biased variance + eps).
std::tuple<at::Tensor, at::Tensor> stats(const at::Tensor &x, double eps) {
  if (x.is_cuda())
    return at::batch_norm_stats(x, eps);
  const at::Tensor xa = x.to(accumulateType(x));
  const std::vector<int64_t> dims = reducedDims(x);
  return {xa.mean(dims), (xa.var(dims, /*unbiased=*/false) + eps).rsqrt()};
}

/// batch_norm_gather_stats_with_counts: the global mean and inverse standard deviation from
/// the ranks' ([world, C]) and their element counts ([world]), merged rank by rank; the
/// running statistics move towards the mean and the unbiased variance.
std::tuple<at::Tensor, at::Tensor> gatherStats(const at::Tensor &x, const at::Tensor &means,
                                               const at::Tensor &invstds,
                                               const std::optional<at::Tensor> &runningMean,
                                               const std::optional<at::Tensor> &runningVar,
                                               double momentum, double eps,
                                               const at::Tensor &counts) {
  if (x.is_cuda())
    return at::batch_norm_gather_stats_with_counts(x, means, invstds, runningMean, runningVar,
                                                   momentum, eps, counts);
  at::Tensor mean = at::zeros_like(means[0]), sumSquares = at::zeros_like(means[0]);
  at::Tensor n = at::zeros({}, means.options());
  for (int64_t r = 0; r < means.size(0); ++r) {
    const at::Tensor count = counts[r].to(means.scalar_type());
    const at::Tensor factor = 1 / (n + count);
    sumSquares = sumSquares + ((1 / invstds[r]).pow(2) - eps) * count +
                 (mean - means[r]).pow(2) * n * count * factor;
    mean = n * factor * mean + count * factor * means[r];
    n = n + count;
  }
  if (runningMean && runningMean->defined())
    runningMean->mul_(1 - momentum).add_(mean.to(runningMean->scalar_type()), momentum);
  if (runningVar && runningVar->defined())
    runningVar->mul_(1 - momentum)
        .add_((sumSquares / (n - 1)).to(runningVar->scalar_type()), momentum);
  return {mean, (sumSquares / n + eps).rsqrt()};
}

/// batch_norm_elemt: (x - mean) * invstd * weight + bias, in x's type.
at::Tensor elemt(const at::Tensor &x, const at::Tensor &weight,
                 const std::optional<at::Tensor> &bias, const at::Tensor &mean,
                 const at::Tensor &invstd, double eps) {
  if (x.is_cuda())
    return at::batch_norm_elemt(x, weight, bias, mean, invstd, eps);
  at::Tensor y = (x.to(accumulateType(x)) - perChannel(mean, x)) * perChannel(invstd, x);
  if (weight.defined())
    y = y * perChannel(weight, x);
  if (bias && bias->defined())
    y = y + perChannel(*bias, x);
  return y.to(x.scalar_type());
}

/// batch_norm_backward_reduce: the per-channel sums of dy and dy * (x - mean), and the weight
/// and bias gradients they make (undefined where not wanted).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
backwardReduce(const at::Tensor &dy, const at::Tensor &x, const at::Tensor &mean,
               const at::Tensor &invstd, const at::Tensor &weight, bool inputGrad, bool weightGrad,
               bool biasGrad) {
  if (x.is_cuda())
    return at::batch_norm_backward_reduce(dy, x, mean, invstd, weight, inputGrad, weightGrad,
                                          biasGrad);
  const at::ScalarType type = accumulateType(x);
  const std::vector<int64_t> dims = reducedDims(x);
  const at::Tensor dya = dy.to(type);
  const at::Tensor sumDy = dya.sum(dims);
  const at::Tensor sumDyXmu = (dya * (x.to(type) - perChannel(mean, x))).sum(dims);
  // The parameters' gradients in the parameters' type (weight and bias share it).
  const at::ScalarType parameterType = weight.defined() ? weight.scalar_type() : type;
  at::Tensor gradWeight, gradBias;
  if (weightGrad)
    gradWeight = (sumDyXmu * invstd).to(parameterType);
  if (biasGrad)
    gradBias = sumDy.to(parameterType);
  return {sumDy, sumDyXmu, gradWeight, gradBias};
}

/// batch_norm_backward_elemt: the input gradient of batch norm over the global batch from the
/// all-reduced sums and every rank's element count ([world], int).
at::Tensor backwardElemt(const at::Tensor &dy, const at::Tensor &x, const at::Tensor &mean,
                         const at::Tensor &invstd, const at::Tensor &weight,
                         const at::Tensor &sumDy, const at::Tensor &sumDyXmu,
                         const at::Tensor &counts) {
  if (x.is_cuda())
    return at::batch_norm_backward_elemt(dy, x, mean, invstd, weight, sumDy, sumDyXmu, counts);
  const at::ScalarType type = accumulateType(x);
  const at::Tensor total = counts.sum().to(type);
  const at::Tensor scale = weight.defined() ? invstd * weight : invstd;
  const at::Tensor gradInput =
      (dy.to(type) - perChannel(sumDy / total, x) -
       (x.to(type) - perChannel(mean, x)) * perChannel(sumDyXmu / total * invstd * invstd, x)) *
      perChannel(scale, x);
  return gradInput.to(x.scalar_type());
}

} // namespace kernels

/// More than one rank: torch.nn.SyncBatchNorm's forward and backward, step for step.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &input,
                            const std::optional<at::Tensor> &weightArg,
                            const std::optional<at::Tensor> &bias,
                            const std::optional<at::Tensor> &runningMean,
                            const std::optional<at::Tensor> &runningVar, double momentum,
                            double eps) {
    const at::Tensor weight = orUndefined(weightArg);
    // What backward computes (torch.nn.SyncBatchNorm's needs_input_grad).
    ctx->saved_data["input_g"] = input.requires_grad();
    ctx->saved_data["weight_g"] = weight.defined() && weight.requires_grad();
    ctx->saved_data["bias_g"] = bias && bias->defined() && bias->requires_grad();
    const at::Tensor x = batchNormLayout(input);
    const at::Tensor w = weight.defined() ? weight.contiguous() : weight;
    const int64_t channels = x.size(1);
    auto [localMean, localInvstd] = kernels::stats(x, eps);
    at::Tensor count =
        at::full({1}, static_cast<double>(x.numel() / channels), localMean.options());
    // [world, 2C + 1] -> the ranks' means, inverse standard deviations and counts.
    const at::Tensor all = allGather(at::cat({localMean, localInvstd, count}));
    const std::vector<at::Tensor> parts = all.split(channels, 1);
    at::Tensor counts = parts[2].view({-1});
    if (runningMean && runningMean->defined() && counts.scalar_type() != runningMean->scalar_type())
      counts = counts.to(runningMean->scalar_type());
    auto [mean, invstd] =
        kernels::gatherStats(x, parts[0], parts[1], runningMean, runningVar, momentum, eps, counts);
    ctx->save_for_backward({x, w, mean, invstd, parts[2].to(at::kInt)});
    return kernels::elemt(x, w, bias, mean, invstd, eps);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    // Autograd records the backward only for a double backward (create_graph=True), which
    // this has not (nor has torch.nn.SyncBatchNorm).
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "ganc::sync_batch_norm has no double backward at more than one rank (a "
                "gradient penalty through a synchronised batch norm)");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &mean = saved[2], &invstd = saved[3], &counts = saved[4];
    at::Tensor w = saved[1];
    const at::Tensor dy = batchNormLayout(grads[0]);
    const bool inputGrad = ctx->saved_data["input_g"].toBool();
    const bool weightGrad = ctx->saved_data["weight_g"].toBool();
    const bool biasGrad = ctx->saved_data["bias_g"].toBool();
    auto [sumDy, sumDyXmu, gradWeight, gradBias] =
        kernels::backwardReduce(dy, x, mean, invstd, w, inputGrad, weightGrad, biasGrad);
    at::Tensor gradInput;
    if (inputGrad) {
      at::Tensor sums = at::cat({sumDy, sumDyXmu});
      allReduce(sums);
      const std::vector<at::Tensor> split = sums.split(sumDy.size(0));
      if (w.defined() && w.scalar_type() != mean.scalar_type())
        w = w.to(mean.scalar_type());
      gradInput = kernels::backwardElemt(dy, x, mean, invstd, w, split[0], split[1], counts);
    }
    if (!weightGrad)
      gradWeight = at::Tensor();
    if (!biasGrad)
      gradBias = at::Tensor();
    return {gradInput,    gradWeight,   gradBias,    at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor syncBatchNorm(const at::Tensor &input, const std::optional<at::Tensor> &weight,
                         const std::optional<at::Tensor> &bias,
                         const std::optional<at::Tensor> &runningMean,
                         const std::optional<at::Tensor> &runningVar, bool training,
                         double momentum, double eps) {
  if (!training || !distributed())
    return at::batch_norm(input, weight, bias, runningMean, runningVar, training, momentum, eps,
                          /*cudnn_enabled=*/true);
  return SyncBatchNormFunction::apply(input, weight, bias, runningMean, runningVar, momentum, eps);
}

} // namespace

TORCH_LIBRARY_IMPL(ganc, CompositeImplicitAutograd, m) {
  m.impl("sync_batch_norm", &syncBatchNorm);
}

void setSyncBatchNormGroup(c10::intrusive_ptr<c10d::Backend> group) {
  syncGroup() = std::move(group);
}

} // namespace ganc::ops
