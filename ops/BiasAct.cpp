// ganc::bias_act and ganc::bias_act_backward: their CPU kernels and their autograd.
//
// Forward, per element (the reference's order of operations; the CPU runs it as the
// reference's ATen kernels, CUDA as one fused kernel in opmath precision):
//   z = x + b[c];  a = act(z);  y = a * gain;  y = min(max(y, -clamp), clamp) if clamp >= 0
// Backward, per element (the reference's autograd: clamp's, mul's, then the activation's):
//   t = grad where -clamp <= act(z) * gain <= clamp, else 0;  t = t * gain;  dz = t * act'(z)
// with act' = 1 (linear), z > 0 (relu), z > 0 ? 1 : alpha (lrelu). The gradient of b is dz
// summed over every dimension but `dim`. bias_act_backward recomputes z from x and b (nothing
// saved beyond the inputs) and is linear in grad with a piecewise constant factor, so its own
// gradient with respect to grad is itself and with respect to x and b zero: R1 and path
// length take the same kernel at every order.
#include "ops/Ops.h"
#include "ops/OpsInternal.h"

#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace ganc::ops {

bool activationNamed(c10::string_view name, Activation &out) {
  if (name == "linear")
    out = Activation::Linear;
  else if (name == "relu")
    out = Activation::Relu;
  else if (name == "lrelu")
    out = Activation::LeakyRelu;
  else
    return false;
  return true;
}

namespace detail {

std::array<at::Tensor, 2> biasActInputs(const at::Tensor &x, const c10::optional<at::Tensor> &b,
                                        int64_t &dim, c10::string_view act, Activation &a) {
  TORCH_CHECK(activationNamed(act, a), "ganc::bias_act: no activation '", std::string(act),
              "' (linear, relu, lrelu)");
  TORCH_CHECK(x.is_floating_point(), "ganc::bias_act: x must be floating point, not ",
              x.scalar_type());
  if (!b || !b->defined())
    return {x, at::Tensor()};
  TORCH_CHECK(x.dim() > 0, "ganc::bias_act: a bias needs x to have a dimension `dim`");
  dim = c10::maybe_wrap_dim(dim, x.dim());
  TORCH_CHECK(b->dim() == 1 && b->size(0) == x.size(dim), "ganc::bias_act: b must be 1-D of ",
              x.size(dim), " (x's dimension ", dim, "), not ", b->sizes());
  const at::ScalarType type = at::promote_types(x.scalar_type(), b->scalar_type());
  return {x.to(type), b->to(type).contiguous()};
}

void laidOutAlike(at::Tensor &grad, at::Tensor &x) {
  if (grad.defined()) {
    grad = grad.to(x.scalar_type());
    TORCH_CHECK(grad.sizes() == x.sizes(), "ganc::bias_act_backward: grad ", grad.sizes(),
                " and x ", x.sizes(), " differ");
    if (grad.strides() != x.strides() || !x.is_non_overlapping_and_dense()) {
      x = x.contiguous();
      grad = grad.contiguous();
    }
  } else if (!x.is_non_overlapping_and_dense()) {
    x = x.contiguous();
  }
}

} // namespace detail

namespace {

using detail::biasActInputs;

/// b shaped to broadcast along `dim` of x.
at::Tensor alongDim(const at::Tensor &b, const at::Tensor &x, int64_t dim) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(dim)] = -1;
  return b.reshape(shape);
}

/// act(z) * gain, before the clamp: the reference's operations, one ATen kernel each.
at::Tensor scaled(const at::Tensor &z, Activation a, double alpha, double gain) {
  at::Tensor y = a == Activation::LeakyRelu ? at::leaky_relu(z, alpha)
                 : a == Activation::Relu    ? at::relu(z)
                                            : z;
  return gain != 1.0 ? y * gain : y;
}

/// On the CPU the op is the reference's composition, each step one vectorised ATen kernel
/// (bit for bit the reference's numbers, forward and backward); the fused kernels are the
/// GPU's (ops/cuda/BiasAct.cu), where the memory traffic is the cost.
at::Tensor biasActCpu(const at::Tensor &xIn, const c10::optional<at::Tensor> &bIn, int64_t dim,
                      c10::string_view act, double alpha, double gain, double clamp) {
  Activation a{};
  auto [x, b] = biasActInputs(xIn, bIn, dim, act, a);
  const at::Tensor y = scaled(b.defined() ? x + alongDim(b, x, dim) : x, a, alpha, gain);
  return clamp >= 0 ? y.clamp(-clamp, clamp) : y;
}

/// The reference's autograd, in its order: clamp's backward, mul's, the activation's.
at::Tensor biasActBackwardCpu(const at::Tensor &gradIn, const at::Tensor &xIn,
                              const c10::optional<at::Tensor> &bIn, int64_t dim,
                              c10::string_view act, double alpha, double gain, double clamp) {
  Activation a{};
  auto [x, b] = biasActInputs(xIn, bIn, dim, act, a);
  at::Tensor g = gradIn.to(x.scalar_type());
  TORCH_CHECK(g.sizes() == x.sizes(), "ganc::bias_act_backward: grad ", g.sizes(), " and x ",
              x.sizes(), " differ");
  const at::Tensor z = b.defined() ? x + alongDim(b, x, dim) : x;
  if (clamp >= 0) {
    const at::Tensor y = scaled(z, a, alpha, gain);
    g = at::where(at::logical_and(y >= -clamp, y <= clamp), g, at::zeros({}, g.options()));
  }
  if (gain != 1.0)
    g = g * gain;
  if (a == Activation::LeakyRelu)
    return at::leaky_relu_backward(g, z, alpha, false);
  if (a == Activation::Relu)
    return at::threshold_backward(g, at::relu(z), 0);
  return g;
}

at::Tensor callBackward(const at::Tensor &grad, const at::Tensor &x, const at::Tensor &b,
                        int64_t dim, const std::string &act, double alpha, double gain,
                        double clamp) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ganc::bias_act_backward", "")
                             .typed<decltype(biasActBackwardCpu)>();
  return op.call(grad, x, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt, dim, act,
                 alpha, gain, clamp);
}

void saveArguments(torch::autograd::AutogradContext *ctx, int64_t dim, c10::string_view act,
                   double alpha, double gain, double clamp) {
  ctx->saved_data["dim"] = dim;
  ctx->saved_data["act"] = std::string(act);
  ctx->saved_data["alpha"] = alpha;
  ctx->saved_data["gain"] = gain;
  ctx->saved_data["clamp"] = clamp;
}

/// The gradient with respect to `grad` of bias_act_backward, on the CPU: the reference's own
/// double backward, in its order (the activation's, mul's, then clamp's), so that R1 and path
/// length through the fused op are the reference's bit for bit there.
at::Tensor doubleBackwardCpu(const at::Tensor &gg, const at::Tensor &xIn, const at::Tensor &bIn,
                             int64_t dim, c10::string_view act, double alpha, double gain,
                             double clamp) {
  Activation a{};
  auto [x, b] = biasActInputs(xIn, bIn.defined() ? c10::optional<at::Tensor>(bIn) : c10::nullopt,
                              dim, act, a);
  const at::Tensor z = b.defined() ? x + alongDim(b, x, dim) : x;
  at::Tensor g = gg.to(x.scalar_type());
  if (a == Activation::LeakyRelu)
    g = at::leaky_relu_backward(g, z, alpha, false);
  else if (a == Activation::Relu)
    g = at::threshold_backward(g, at::relu(z), 0);
  if (gain != 1.0)
    g = g * gain;
  if (clamp >= 0) {
    const at::Tensor y = scaled(z, a, alpha, gain);
    g = at::where(at::logical_and(y >= -clamp, y <= clamp), g, at::zeros({}, g.options()));
  }
  return g;
}

/// The gradient with respect to x of the saved arguments' bias_act, through the dispatcher.
at::Tensor savedBackward(torch::autograd::AutogradContext *ctx, const at::Tensor &grad,
                         const at::Tensor &x, const at::Tensor &b) {
  return callBackward(grad, x, b, ctx->saved_data["dim"].toInt(),
                      ctx->saved_data["act"].toStringRef(), ctx->saved_data["alpha"].toDouble(),
                      ctx->saved_data["gain"].toDouble(), ctx->saved_data["clamp"].toDouble());
}

/// An autograd Function's optional tensor argument (it takes no undefined tensor).
c10::optional<at::Tensor> optional(const at::Tensor &t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

/// The gradient of b: dz summed over every dimension but `dim`.
at::Tensor biasGradient(const at::Tensor &dz, int64_t dim) {
  // As autograd reduces the reference's broadcast add: sum_to_size, then the view back.
  std::vector<int64_t> shape(static_cast<size_t>(dz.dim()), 1);
  shape[static_cast<size_t>(dim)] = dz.size(dim);
  return dz.sum_to_size(shape).reshape({-1});
}

/// bias_act_backward's autograd: linear in grad, piecewise constant in x and b.
class BiasActBackwardFunction : public torch::autograd::Function<BiasActBackwardFunction> {
public:
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &grad,
                            const at::Tensor &x, const c10::optional<at::Tensor> &b, int64_t dim,
                            const std::string &act, double alpha, double gain, double clamp) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({x, b.value_or(at::Tensor())});
    saveArguments(ctx, dim, act, alpha, gain, clamp);
    return callBackward(grad, x, b.value_or(at::Tensor()), dim, act, alpha, gain, clamp);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor gg =
        grads[0].is_cuda()
            ? savedBackward(ctx, grads[0], saved[0], saved[1])
            : doubleBackwardCpu(
                  grads[0], saved[0], saved[1], ctx->saved_data["dim"].toInt(),
                  ctx->saved_data["act"].toStringRef(), ctx->saved_data["alpha"].toDouble(),
                  ctx->saved_data["gain"].toDouble(), ctx->saved_data["clamp"].toDouble());
    // Zero, not undefined, with respect to x and b: the reference's leaky_relu_backward gives
    // its input a zero gradient, so the parameters a phase's plan finds used (b, through R1)
    // still receive one.
    const at::Tensor dx = ctx->needs_input_grad(1) ? at::zeros_like(saved[0]) : at::Tensor();
    const at::Tensor db =
        saved[1].defined() && ctx->needs_input_grad(2) ? at::zeros_like(saved[1]) : at::Tensor();
    return {gg, dx, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class BiasActFunction : public torch::autograd::Function<BiasActFunction> {
public:
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                            const c10::optional<at::Tensor> &b, int64_t dim, const std::string &act,
                            double alpha, double gain, double clamp) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({x, b.value_or(at::Tensor())});
    saveArguments(ctx, dim, act, alpha, gain, clamp);
    return biasAct(x, b, dim, act, alpha, gain, clamp);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t dim = ctx->saved_data["dim"].toInt();
    at::Tensor dz = BiasActBackwardFunction::apply(
        grads[0], saved[0], optional(saved[1]), dim, ctx->saved_data["act"].toStringRef(),
        ctx->saved_data["alpha"].toDouble(), ctx->saved_data["gain"].toDouble(),
        ctx->saved_data["clamp"].toDouble());
    at::Tensor db = saved[1].defined() && ctx->needs_input_grad(1)
                        ? biasGradient(dz, dim).to(saved[1].scalar_type())
                        : at::Tensor();
    return {dz, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor biasActAutograd(const at::Tensor &xIn, const c10::optional<at::Tensor> &bIn, int64_t dim,
                           c10::string_view act, double alpha, double gain, double clamp) {
  Activation a{};
  auto [x, b] = biasActInputs(xIn, bIn, dim, act, a);
  return BiasActFunction::apply(x, optional(b), dim, std::string(act), alpha, gain, clamp);
}

at::Tensor biasActBackwardAutograd(const at::Tensor &grad, const at::Tensor &x,
                                   const c10::optional<at::Tensor> &b, int64_t dim,
                                   c10::string_view act, double alpha, double gain, double clamp) {
  return BiasActBackwardFunction::apply(grad, x, optional(b ? *b : at::Tensor()), dim,
                                        std::string(act), alpha, gain, clamp);
}

} // namespace

at::Tensor biasAct(const at::Tensor &x, const c10::optional<at::Tensor> &b, int64_t dim,
                   c10::string_view act, double alpha, double gain, double clamp) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ganc::bias_act", "")
                             .typed<decltype(biasActCpu)>();
  return op.call(x, b, dim, act, alpha, gain, clamp);
}

TORCH_LIBRARY_IMPL(ganc, CPU, m) {
  m.impl("bias_act", biasActCpu);
  m.impl("bias_act_backward", biasActBackwardCpu);
}
TORCH_LIBRARY_IMPL(ganc, Autograd, m) {
  m.impl("bias_act", biasActAutograd);
  m.impl("bias_act_backward", biasActBackwardAutograd);
}

} // namespace ganc::ops
