// ganc::sync_batch_norm: batch norm whose training statistics and backward sums are reduced
// over every rank, as torch.nn.SyncBatchNorm defines them.
//
// Three implementations of one definition, chosen per call:
// - one rank (or no process group): batch norm itself (aten::batch_norm, with its double
//   backward), as torch.nn.SyncBatchNorm falls back to F.batch_norm at world size 1;
// - CUDA: torch.nn.SyncBatchNorm's own kernels in its order (batch_norm_stats, all-gather,
//   batch_norm_gather_stats_with_counts, batch_norm_elemt; batch_norm_backward_reduce,
//   all-reduce, batch_norm_backward_elemt; torch/nn/modules/_functions.py), so the two agree
//   bit for bit and the op costs what SyncBatchNorm's does;
// - CPU, where those kernels do not exist: each rank's per-channel mean, biased variance and
//   element count are all-gathered; the global mean and variance combine them exactly (Chan
//   et al.), the output is normalised with them, and the running statistics move towards the
//   global mean and the unbiased global variance. Backward: the per-channel sums of dy and
//   dy * (x - mean) are all-reduced, so the input gradient is that of batch norm over the
//   global batch.
// In every case the weight and bias gradients stay local (the bucketed all-reduce averages
// them like any parameter's). Eval mode is plain batch norm with the running statistics.
#include "frontend/SyncBatchNorm.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <mutex>

namespace ganc::frontend {

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
  syncGroup()->allgather(gathered, in, options)->wait();
  return torch::stack(gathered[0]);
}

/// Sums `t` over the ranks, in place; waited for at once.
void allReduce(at::Tensor &t) {
  std::vector<at::Tensor> io{t};
  c10d::AllreduceOptions options;
  options.asyncOp = false;
  syncGroup()->allreduce(io, options)->wait();
}

/// The layout batch norm's CUDA kernels take: channels-last as it is, anything else
/// contiguous (what SyncBatchNorm does to its input and incoming gradient).
at::Tensor batchNormLayout(const at::Tensor &t) {
  if (t.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      t.is_contiguous(at::MemoryFormat::ChannelsLast3d))
    return t;
  return t.contiguous();
}

/// Called at the start of a backward: autograd records it only for a double backward
/// (create_graph=True), which neither implementation has (nor has torch.nn.SyncBatchNorm).
void refuseDoubleBackward() {
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "ganc::sync_batch_norm has no double backward at more than one rank (a "
              "gradient penalty through a synchronised batch norm)");
}

/// CUDA, more than one rank: torch.nn.SyncBatchNorm's forward and backward, step for step.
struct SyncBatchNormCudaFunction : torch::autograd::Function<SyncBatchNormCudaFunction> {
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
    auto [localMean, localInvstd] = at::batch_norm_stats(x, eps);
    at::Tensor count =
        at::full({1}, static_cast<double>(x.numel() / channels), localMean.options());
    // [world, 2C + 1] -> the ranks' means, inverse standard deviations and counts.
    const at::Tensor all = allGather(at::cat({localMean, localInvstd, count}));
    const std::vector<at::Tensor> parts = all.split(channels, 1);
    at::Tensor counts = parts[2].view({-1});
    if (runningMean && runningMean->defined() && counts.scalar_type() != runningMean->scalar_type())
      counts = counts.to(runningMean->scalar_type());
    auto [mean, invstd] = at::batch_norm_gather_stats_with_counts(
        x, parts[0], parts[1], runningMean, runningVar, momentum, eps, counts);
    ctx->save_for_backward({x, w, mean, invstd, parts[2].to(at::kInt)});
    return at::batch_norm_elemt(x, w, bias, mean, invstd, eps);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    refuseDoubleBackward();
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &mean = saved[2], &invstd = saved[3], &counts = saved[4];
    at::Tensor w = saved[1];
    const at::Tensor dy = batchNormLayout(grads[0]);
    const bool inputGrad = ctx->saved_data["input_g"].toBool();
    const bool weightGrad = ctx->saved_data["weight_g"].toBool();
    const bool biasGrad = ctx->saved_data["bias_g"].toBool();
    auto [sumDy, sumDyXmu, gradWeight, gradBias] =
        at::batch_norm_backward_reduce(dy, x, mean, invstd, w, inputGrad, weightGrad, biasGrad);
    at::Tensor gradInput;
    if (inputGrad) {
      at::Tensor sums = at::cat({sumDy, sumDyXmu});
      allReduce(sums);
      const std::vector<at::Tensor> split = sums.split(sumDy.size(0));
      if (w.defined() && w.scalar_type() != mean.scalar_type())
        w = w.to(mean.scalar_type());
      gradInput = at::batch_norm_backward_elemt(dy, x, mean, invstd, w, split[0], split[1], counts);
    }
    if (!weightGrad)
      gradWeight = at::Tensor();
    if (!biasGrad)
      gradBias = at::Tensor();
    return {gradInput,    gradWeight,   gradBias,    at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// CPU, more than one rank: the statistics combined from each rank's moments.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &input,
                            const std::optional<at::Tensor> &weightArg,
                            const std::optional<at::Tensor> &biasArg,
                            const std::optional<at::Tensor> &runningMeanArg,
                            const std::optional<at::Tensor> &runningVarArg, double momentum,
                            double eps) {
    const at::Tensor weight = orUndefined(weightArg), bias = orUndefined(biasArg);
    at::Tensor runningMean = orUndefined(runningMeanArg), runningVar = orUndefined(runningVarArg);
    ctx->saved_data["has_bias"] = bias.defined();
    // Statistics in float32 at least (float64 inputs keep float64), as batch norm kernels do.
    const at::Tensor x =
        input.to(input.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32);
    const std::vector<int64_t> dims = reducedDims(x);
    at::Tensor mean = x.mean(dims);
    at::Tensor var = x.var(dims, /*unbiased=*/false);
    const double localCount = static_cast<double>(x.numel() / x.size(1));
    at::Tensor count = torch::full({x.size(1)}, localCount, x.options());
    {
      const at::Tensor all = allGather(torch::stack({mean, var, count})); // [world, 3, C]
      at::Tensor means = all.select(1, 0), vars = all.select(1, 1), counts = all.select(1, 2);
      count = counts.sum(0);
      mean = (means * counts).sum(0) / count;
      var = ((vars + (means - mean).pow(2)) * counts).sum(0) / count;
    }
    at::Tensor invstd = (var + eps).rsqrt();
    {
      torch::NoGradGuard noGrad;
      if (runningMean.defined())
        runningMean.mul_(1 - momentum).add_(mean.to(runningMean.scalar_type()), momentum);
      if (runningVar.defined())
        runningVar.mul_(1 - momentum)
            .add_((var * count / (count - 1)).to(runningVar.scalar_type()), momentum);
    }
    at::Tensor y = (x - perChannel(mean, x)) * perChannel(invstd, x);
    if (weight.defined())
      y = y * perChannel(weight, x);
    if (bias.defined())
      y = y + perChannel(bias, x);
    ctx->save_for_backward({x, mean, invstd, weight, count});
    return y.to(input.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    refuseDoubleBackward();
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &mean = saved[1], &invstd = saved[2], &weight = saved[3],
                     &count = saved[4];
    const at::Tensor dy = grads[0].to(x.scalar_type());
    const std::vector<int64_t> dims = reducedDims(x);
    const at::Tensor xmu = x - perChannel(mean, x);
    at::Tensor sumDy = dy.sum(dims);
    at::Tensor sumDyXmu = (dy * xmu).sum(dims);
    at::Tensor gradWeight =
        weight.defined() ? (dy * xmu * perChannel(invstd, x)).sum(dims) : at::Tensor();
    at::Tensor gradBias = sumDy.clone();
    {
      at::Tensor sums = torch::stack({sumDy, sumDyXmu});
      allReduce(sums);
      sumDy = sums[0];
      sumDyXmu = sums[1];
    }
    at::Tensor scale = weight.defined() ? invstd * weight : invstd;
    at::Tensor gradInput = (dy - perChannel(sumDy / count, x) -
                            xmu * perChannel(invstd * invstd * sumDyXmu / count, x)) *
                           perChannel(scale, x);
    return {gradInput.to(grads[0].scalar_type()),
            gradWeight,
            ctx->saved_data["has_bias"].toBool() ? gradBias : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
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
  if (input.is_cuda())
    return SyncBatchNormCudaFunction::apply(input, weight, bias, runningMean, runningVar, momentum,
                                            eps);
  return SyncBatchNormFunction::apply(input, weight, bias, runningMean, runningVar, momentum, eps);
}

} // namespace

TORCH_LIBRARY(ganc, m) {
  m.def("sync_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, "
        "Tensor? running_var, bool training, float momentum, float eps) -> Tensor",
        &syncBatchNorm);
}

void setSyncBatchNormGroup(c10::intrusive_ptr<c10d::Backend> group) {
  syncGroup() = std::move(group);
}

namespace {

/// The descendant of `from` that a call in an inlined call chain entered: the one with the
/// call's attribute name and class. A module iterated in a container (ModuleList, ModuleDict)
/// or indexed in one is called without a call to the container, so it can be deeper than a
/// child. Empty unless exactly one descendant fits.
std::optional<torch::jit::NameModule> calledModule(const torch::jit::Module &from,
                                                   const torch::jit::ModuleInstanceInfo &call) {
  std::optional<torch::jit::NameModule> found;
  for (const torch::jit::NameModule &sub : from.named_modules()) {
    const size_t dot = sub.name.rfind('.');
    const std::string last = dot == std::string::npos ? sub.name : sub.name.substr(dot + 1);
    if (sub.name.empty() || last != call.instance_name() || !call.class_type() ||
        sub.value.type()->name() != call.class_type()->name())
      continue;
    if (found)
      return std::nullopt;
    found = sub;
  }
  return found;
}

/// The path of the module an aten::batch_norm node belongs to, with a trailing '.'
/// ("generator.main.1."): the module of the attribute its weight, running mean or running
/// variance reads (a layer with affine=False has no weight), else the chain of module calls it
/// was inlined from, resolved against `root` (a layer with neither weight nor running
/// statistics); "" when unknown.
std::string ownerPath(torch::jit::Node *node,
                      const std::map<torch::jit::Value *, std::string> &paths,
                      const torch::jit::Module &root) {
  // aten::batch_norm(input, weight, bias, running_mean, running_var, ...).
  for (size_t input : {1, 3, 4}) {
    auto path = paths.find(node->inputs()[input]);
    if (path != paths.end())
      return path->second.substr(0, path->second.rfind('.') + 1);
  }
  std::optional<torch::jit::InlinedCallStackPtr> calls = node->callstack();
  if (!calls)
    return "";
  std::string owner;
  torch::jit::Module module = root;
  for (const torch::jit::InlinedCallStackEntry &call : (*calls)->vec()) {
    const std::optional<torch::jit::ModuleInstanceInfo> &entered = std::get<2>(call);
    if (!entered || entered->instance_name() == "SELF")
      continue; // a function, or another method of the same module
    std::optional<torch::jit::NameModule> sub = calledModule(module, *entered);
    if (!sub)
      return "";
    owner += sub->name + ".";
    module = sub->value;
  }
  return owner;
}

} // namespace

void rewriteSyncBatchNorm(torch::jit::Graph &graph,
                          const std::map<torch::jit::Value *, std::string> &paths,
                          const torch::jit::Module &root,
                          const std::vector<std::string> &submodules,
                          std::set<std::string> &rewritten) {
  static const c10::Symbol kSync = c10::Symbol::fromQualString("ganc::sync_batch_norm");
  std::vector<torch::jit::Node *> found;
  std::function<void(torch::jit::Block *)> visit = [&](torch::jit::Block *block) {
    for (torch::jit::Node *node : block->nodes()) {
      if (node->kind() == c10::aten::batch_norm)
        found.push_back(node);
      for (torch::jit::Block *b : node->blocks())
        visit(b);
    }
  };
  visit(graph.block());
  for (torch::jit::Node *node : found) {
    const std::string owner = ownerPath(node, paths, root);
    if (owner.empty())
      continue;
    for (const std::string &sub : submodules) {
      if (owner.compare(0, sub.size() + 1, sub + ".") != 0)
        continue;
      torch::jit::WithInsertPoint guard(node);
      // aten::batch_norm(input, weight, bias, mean, var, training, momentum, eps, cudnn).
      std::vector<torch::jit::Value *> inputs(node->inputs().begin(), node->inputs().end() - 1);
      torch::jit::Node *sync = graph.insertNode(graph.create(kSync, inputs, 1));
      sync->output()->setType(node->output()->type());
      node->output()->replaceAllUsesWith(sync->output());
      node->destroy();
      rewritten.insert(sub);
      break;
    }
  }
}

} // namespace ganc::frontend
