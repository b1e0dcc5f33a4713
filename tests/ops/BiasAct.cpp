// A TORCH_LIBRARY operator library for the tests, in the shape of StyleGAN's fused bias_act:
// ganc_test::bias_act(x, b, alpha, gain) = leaky_relu(x + b (per channel), alpha) * gain, with
// a kernel for every backend and a C++ autograd kernel whose backward is written with
// differentiable operations (so R1's double backward goes through it).
#include <torch/library.h>
#include <torch/torch.h>

namespace {

at::Tensor channelShaped(const at::Tensor &b, const at::Tensor &x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = -1;
  return b.reshape(shape);
}

/// The forward kernel (any device: ATen operations).
at::Tensor biasActKernel(const at::Tensor &x, const at::Tensor &b, double alpha, double gain) {
  return at::leaky_relu(x + channelShaped(b, x), alpha) * gain;
}

class BiasAct : public torch::autograd::Function<BiasAct> {
public:
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                            const at::Tensor &b, double alpha, double gain) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor pre = x + channelShaped(b, x);
    ctx->save_for_backward({pre});
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["gain"] = gain;
    return at::leaky_relu(pre, alpha) * gain;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor pre = ctx->get_saved_variables()[0];
    const double alpha = ctx->saved_data["alpha"].toDouble();
    const double gain = ctx->saved_data["gain"].toDouble();
    // The slope of leaky ReLU at `pre` (piecewise constant: no gradient of its own).
    at::Tensor slope = at::where(pre.detach() > 0, at::ones_like(pre), at::full_like(pre, alpha));
    at::Tensor dx = grads[0] * slope * gain;
    std::vector<int64_t> reduce;
    for (int64_t d = 0; d < dx.dim(); ++d)
      if (d != 1)
        reduce.push_back(d);
    at::Tensor db = dx.sum(reduce);
    return {dx, db, at::Tensor(), at::Tensor()};
  }
};

at::Tensor biasActAutograd(const at::Tensor &x, const at::Tensor &b, double alpha, double gain) {
  return BiasAct::apply(x, b, alpha, gain);
}

} // namespace

TORCH_LIBRARY(ganc_test, m) {
  m.def("bias_act(Tensor x, Tensor b, float alpha, float gain) -> Tensor");
}

TORCH_LIBRARY_IMPL(ganc_test, CompositeExplicitAutograd, m) { m.impl("bias_act", biasActKernel); }

TORCH_LIBRARY_IMPL(ganc_test, Autograd, m) { m.impl("bias_act", biasActAutograd); }
