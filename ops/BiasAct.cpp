// ganc::bias_act and ganc::bias_act_backward: their CPU kernels and their autograd.
//
// Forward, per element (the reference's order of operations, in opmath precision):
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

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
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

/// The parameters every element's arithmetic takes, in the kernel's precision.
template <typename acc_t> struct Elementwise {
  Activation act;
  acc_t alpha, gain, clamp;
  bool clamps, scales;

  /// act(z) * gain, before the clamp.
  acc_t scaled(acc_t z) const {
    const acc_t y = act == Activation::Linear ? z
                    : act == Activation::Relu ? (z > 0 ? z : acc_t(0))
                                              : (z > 0 ? z : z * alpha); // LeakyRelu
    return scales ? y * gain : y;
  }

  acc_t forward(acc_t z) const {
    const acc_t y = scaled(z);
    return clamps ? (y < -clamp ? -clamp : (y > clamp ? clamp : y)) : y;
  }

  acc_t backward(acc_t g, acc_t z) const {
    if (clamps) {
      const acc_t y = scaled(z);
      if (!(y >= -clamp && y <= clamp))
        g = 0;
    }
    if (scales)
      g = g * gain;
    if (act == Activation::Relu)
      return z > 0 ? g : acc_t(0);
    if (act == Activation::LeakyRelu)
      return z > 0 ? g : g * alpha;
    return g;
  }
};

template <typename acc_t>
Elementwise<acc_t> elementwise(Activation act, double alpha, double gain, double clamp) {
  return {act,
          static_cast<acc_t>(alpha),
          static_cast<acc_t>(gain),
          static_cast<acc_t>(clamp),
          clamp >= 0,
          gain != 1.0};
}

/// bias_act over x (grad undefined), or its backward: x (and grad) laid out alike and densely,
/// walked by storage offset, the channel of offset i being (i / stride(dim)) % size(dim).
at::Tensor elementwiseCpu(at::Tensor grad, at::Tensor x, const at::Tensor &b, int64_t dim,
                          Activation a, double alpha, double gain, double clamp) {
  detail::laidOutAlike(grad, x);
  at::Tensor out = at::empty_like(x);
  const int64_t stride = b.defined() ? x.stride(dim) : 1, size = b.defined() ? x.size(dim) : 1;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_act", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const Elementwise<acc_t> e = elementwise<acc_t>(a, alpha, gain, clamp);
    const scalar_t *xp = x.data_ptr<scalar_t>();
    const scalar_t *gp = grad.defined() ? grad.data_ptr<scalar_t>() : nullptr;
    const scalar_t *bp = b.defined() ? b.data_ptr<scalar_t>() : nullptr;
    scalar_t *op = out.data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), 32768, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        // z rounded to scalar_t as the reference's x + b is.
        const acc_t z =
            bp ? static_cast<acc_t>(static_cast<scalar_t>(
                     static_cast<acc_t>(xp[i]) + static_cast<acc_t>(bp[(i / stride) % size])))
               : static_cast<acc_t>(xp[i]);
        op[i] = static_cast<scalar_t>(gp ? e.backward(static_cast<acc_t>(gp[i]), z) : e.forward(z));
      }
    });
  });
  return out;
}

at::Tensor biasActCpu(const at::Tensor &xIn, const c10::optional<at::Tensor> &bIn, int64_t dim,
                      c10::string_view act, double alpha, double gain, double clamp) {
  Activation a{};
  auto [x, b] = biasActInputs(xIn, bIn, dim, act, a);
  return elementwiseCpu(at::Tensor(), x, b, dim, a, alpha, gain, clamp);
}

at::Tensor biasActBackwardCpu(const at::Tensor &grad, const at::Tensor &xIn,
                              const c10::optional<at::Tensor> &bIn, int64_t dim,
                              c10::string_view act, double alpha, double gain, double clamp) {
  Activation a{};
  auto [x, b] = biasActInputs(xIn, bIn, dim, act, a);
  return elementwiseCpu(grad, x, b, dim, a, alpha, gain, clamp);
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
  std::vector<int64_t> over;
  for (int64_t d = 0; d < dz.dim(); ++d)
    if (d != dim)
      over.push_back(d);
  return over.empty() ? dz : dz.sum(over);
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
    return {savedBackward(ctx, grads[0], saved[0], saved[1]),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
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
