// ganc::sync_batch_norm: batch norm whose training statistics and backward sums are reduced
// over every rank, as torch.nn.SyncBatchNorm defines them.
//
// Forward (training): each rank's per-channel mean and biased variance and its element count
// are all-gathered; the global mean and variance combine them exactly (Chan et al.), the
// output is normalised with them, and the running statistics move towards the global mean and
// the unbiased global variance. Backward: the per-channel sums of dy and dy * (x - mean) are
// all-reduced, so the input gradient is that of batch norm over the global batch; the weight
// and bias gradients stay local (the bucketed all-reduce averages them like any parameter's).
// Eval mode is plain batch norm with the running statistics.
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

struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &input,
                            const at::Tensor &weight, const at::Tensor &bias,
                            at::Tensor runningMean, at::Tensor runningVar, double momentum,
                            double eps) {
    // Statistics in float32 at least (float64 inputs keep float64), as batch norm kernels do.
    const at::Tensor x =
        input.to(input.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32);
    const std::vector<int64_t> dims = reducedDims(x);
    at::Tensor mean = x.mean(dims);
    at::Tensor var = x.var(dims, /*unbiased=*/false);
    const double localCount = static_cast<double>(x.numel() / x.size(1));
    at::Tensor count = torch::full({x.size(1)}, localCount, x.options());
    if (distributed()) {
      at::Tensor stats = torch::stack({mean, var, count});
      std::vector<std::vector<at::Tensor>> gathered(1);
      for (int r = 0; r < syncGroup()->getSize(); ++r)
        gathered[0].push_back(torch::empty_like(stats));
      std::vector<at::Tensor> in{stats};
      c10d::AllgatherOptions options;
      options.asyncOp = false; // waited for at once: NCCL runs it on the compute stream
      syncGroup()->allgather(gathered, in, options)->wait();
      at::Tensor all = torch::stack(gathered[0]); // [world, 3, C]
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
    // Autograd records the backward only for a double backward (create_graph=True).
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "ganc::sync_batch_norm has no double backward (a gradient penalty through a "
                "synchronised batch norm)");
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
    if (distributed()) {
      at::Tensor sums = torch::stack({sumDy, sumDyXmu});
      std::vector<at::Tensor> io{sums};
      c10d::AllreduceOptions options;
      options.asyncOp = false;
      syncGroup()->allreduce(io, options)->wait();
      sumDy = sums[0];
      sumDyXmu = sums[1];
    }
    at::Tensor scale = weight.defined() ? invstd * weight : invstd;
    at::Tensor gradInput = (dy - perChannel(sumDy / count, x) -
                            xmu * perChannel(invstd * invstd * sumDyXmu / count, x)) *
                           perChannel(scale, x);
    return {gradInput.to(grads[0].scalar_type()),
            gradWeight,
            weight.defined() ? gradBias : at::Tensor(),
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
  auto value = [](const std::optional<at::Tensor> &t) { return t ? *t : at::Tensor(); };
  if (!training)
    return at::batch_norm(input, weight, bias, runningMean, runningVar, false, momentum, eps,
                          /*cudnn_enabled=*/true);
  return SyncBatchNormFunction::apply(input, value(weight), value(bias), value(runningMean),
                                      value(runningVar), momentum, eps);
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

void rewriteSyncBatchNorm(torch::jit::Graph &graph,
                          const std::map<torch::jit::Value *, std::string> &paths,
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
    auto path = paths.find(node->inputs()[1]);
    if (path == paths.end())
      continue;
    for (const std::string &sub : submodules) {
      if (path->second.compare(0, sub.size() + 1, sub + ".") != 0)
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
