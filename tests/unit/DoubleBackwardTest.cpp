// ganc::convolution against PyTorch's convolution: second-order gradients (a penalty on the
// input's and the weight's gradient, as R1 and path length take) for grouped, depthwise,
// strided, dilated, transposed and 1-D convolutions in float64 with the weight taking a
// gradient (its own formulation throughout), and bit for bit in float32 for a FIR filter that
// takes none. And the rewrite of a phase graph's grouped convolutions, with FileCheck, run
// against the graph it rewrote.
#include "frontend/DoubleBackward.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/testing/file_check.h>
#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace {

using Conv = std::function<at::Tensor(const at::Tensor &, const at::Tensor &,
                                      const std::optional<at::Tensor> &)>;

struct Case {
  std::string name;
  std::vector<int64_t> input, weight, stride, padding, dilation, outputPadding;
  bool transposed;
  int64_t groups;
  bool bias;
};

Conv pytorch(const Case &c) {
  return [c](const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &b) {
    return at::convolution(x, w, b, c.stride, c.padding, c.dilation, c.transposed, c.outputPadding,
                           c.groups);
  };
}

Conv ganc(const Case &c, bool weightGradients, const std::string &origin = "aten::convolution") {
  return [c, weightGradients, origin](const at::Tensor &x, const at::Tensor &w,
                                      const std::optional<at::Tensor> &b) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("ganc::convolution", "")
            .typed<at::Tensor(const at::Tensor &, const at::Tensor &,
                              const std::optional<at::Tensor> &, c10::IntArrayRef, c10::IntArrayRef,
                              c10::IntArrayRef, bool, c10::IntArrayRef, int64_t, bool,
                              c10::string_view)>();
    return op.call(x, w, b, c.stride, c.padding, c.dilation, c.transposed, c.outputPadding,
                   c.groups, weightGradients, origin);
  };
}

/// The gradients, with respect to every leaf that takes one, of a penalty on the first
/// gradients of a nonlinear function of the convolution's output: the input's (R1) and, where
/// the weight takes a gradient, the weight's (which reaches the weight gradient's own
/// backward). `x` may be computed from `upstream`, a leaf as a layer before would be.
std::vector<at::Tensor> penaltyGradients(const Conv &conv, const at::Tensor &x, const at::Tensor &w,
                                         const at::Tensor &b,
                                         const std::vector<at::Tensor> &leaves) {
  const at::Tensor y = conv(x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
  const at::Tensor out = (y.square() * 0.5 + y.sin()).sum();
  std::vector<at::Tensor> wrt{leaves[0]};
  if (w.requires_grad())
    wrt.push_back(w);
  const auto first = torch::autograd::grad({out}, wrt, {}, true, true);
  at::Tensor penalty = first[0].square().sum();
  if (first.size() > 1)
    penalty = penalty + first[1].square().sum();
  return torch::autograd::grad({penalty}, leaves, {}, false, false, true);
}

double relativeDifference(const at::Tensor &a, const at::Tensor &b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item<double>();
}

const std::vector<Case> &cases() {
  static const std::vector<Case> all = {
      {"depthwise", {2, 6, 9, 9}, {6, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, false, 6, true},
      {"strided_dilated",
       {2, 8, 11, 10},
       {12, 4, 3, 3},
       {2, 2},
       {2, 2},
       {2, 2},
       {0, 0},
       false,
       2,
       false},
      {"transposed", {2, 6, 5, 5}, {6, 2, 4, 4}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, true, 3, true},
      {"one_dimensional", {3, 4, 12}, {8, 2, 5}, {1}, {2}, {1}, {0}, false, 2, false},
  };
  return all;
}

TEST(DoubleBackward, SecondOrderGradientsMatchPyTorchInFloat64) {
  torch::manual_seed(0);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  for (const Case &c : cases()) {
    const at::Tensor x = torch::randn(c.input, f64).requires_grad_(true);
    const at::Tensor w = (torch::randn(c.weight, f64) * 0.3).requires_grad_(true);
    const int64_t outChannels = c.transposed ? c.weight[1] * c.groups : c.weight[0];
    const at::Tensor b =
        c.bias ? torch::randn({outChannels}, f64).requires_grad_(true) : at::Tensor();
    std::vector<at::Tensor> leaves{x, w};
    if (c.bias)
      leaves.push_back(b);
    const auto want = penaltyGradients(pytorch(c), x, w, b, leaves);
    const auto got = penaltyGradients(ganc(c, true), x, w, b, leaves);
    ASSERT_EQ(got.size(), want.size()) << c.name;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].defined(), want[i].defined()) << c.name << " leaf " << i;
      if (!want[i].defined())
        continue;
      EXPECT_GT(want[i].abs().max().item<double>(), 0) << c.name << " leaf " << i;
      EXPECT_LT(relativeDifference(got[i], want[i]), 1e-10) << c.name << " leaf " << i;
    }
  }
}

TEST(DoubleBackward, FirFilterIsPyTorchsBitForBit) {
  // upfirdn2d's filter: a depthwise 4x4 convolution whose weight takes no gradient, after a
  // layer whose weight does. PyTorch computes the filter's weight gradient anyway, one
  // convolution per channel; every term the op computes is PyTorch's own.
  torch::manual_seed(1);
  const Case c{"filter", {4, 8, 10, 10}, {8, 1, 4, 4}, {1, 1}, {1, 1},
               {1, 1},   {0, 0},         false,        8,      false};
  const at::Tensor image = torch::randn({4, 3, 10, 10}).requires_grad_(true);
  const at::Tensor layer = (torch::randn({8, 3, 3, 3}) * 0.3).requires_grad_(true);
  const at::Tensor filter = torch::rand(c.weight);
  for (bool weightGradients : {false, true}) {
    const auto run = [&](const Conv &conv) {
      const at::Tensor x = torch::conv2d(image, layer, {}, 1, 1);
      return penaltyGradients(conv, x, filter, at::Tensor(), {image, layer});
    };
    const auto want = run(pytorch(c));
    const auto got = run(ganc(c, weightGradients));
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(torch::equal(got[i], want[i]))
          << "leaf " << i << ", weight_gradients " << weightGradients << ": differs by "
          << relativeDifference(got[i], want[i]);
  }
}

TEST(DoubleBackward, AutocastCastsAsTheReplacedConvolution) {
  // Under CPU autocast (bfloat16), the op casts its inputs as autocast casts those of the op it
  // replaced: aten::conv2d's are cast, aten::convolution's are not (autocast's CPU list). The
  // same dtype and values out as that op, and the same gradients back.
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({2, 6, 8, 8}).requires_grad_(true);
  const at::Tensor w = torch::randn({6, 1, 3, 3});
  const at::Tensor b = torch::randn({6});
  const Case c{"autocast", {2, 6, 8, 8}, {6, 1, 3, 3}, {1, 1}, {1, 1},
               {1, 1},     {0, 0},       false,        6,      true};
  const std::vector<std::pair<std::string, Conv>> replaced = {
      {"aten::conv2d",
       [](const at::Tensor &in, const at::Tensor &k, const std::optional<at::Tensor> &bias) {
         return at::conv2d(in, k, bias, 1, 1, 1, 6);
       }},
      {"aten::convolution", pytorch(c)}};
  for (const auto &[origin, conv] : replaced) {
    const auto run = [&](const Conv &f) {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      const at::Tensor y = f(x, w, b);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
      const auto first =
          torch::autograd::grad({y.to(at::kFloat).square().sum()}, {x}, {}, true, true);
      return std::make_pair(y, torch::autograd::grad({first[0].square().sum()}, {x})[0]);
    };
    const auto [want, wantGrad] = run(conv);
    const auto [got, gotGrad] = run(ganc(c, false, origin));
    EXPECT_EQ(want.scalar_type(), origin == "aten::conv2d" ? at::kBFloat16 : at::kFloat);
    EXPECT_EQ(got.scalar_type(), want.scalar_type()) << origin;
    EXPECT_TRUE(torch::equal(got, want)) << origin;
    EXPECT_TRUE(torch::equal(gotGrad, wantGrad)) << origin;
  }
}

TEST(DoubleBackward, FindsTheGradientThatIsDifferentiatedAgain) {
  const auto graphWith = [](bool createGraph) {
    auto graph = std::make_shared<torch::jit::Graph>();
    torch::jit::parseIR(R"IR(
graph(%y : Tensor, %x : Tensor):
  %none : NoneType = prim::Constant()
  %create : bool = prim::Constant[value=)IR" +
                            std::to_string(createGraph) +
                            R"IR(]()
  %unused : bool = prim::Constant[value=0]()
  %outs : Tensor[] = prim::ListConstruct(%y)
  %ins : Tensor[] = prim::ListConstruct(%x)
  %g : Tensor?[] = aten::grad(%outs, %ins, %none, %none, %create, %unused)
  return (%g))IR",
                        graph.get());
    return graph;
  };
  EXPECT_TRUE(ganc::frontend::differentiatesTwice(*graphWith(true)));
  EXPECT_FALSE(ganc::frontend::differentiatesTwice(*graphWith(false)));
}

TEST(DoubleBackward, RewritesTheGroupedConvolutionsAndRunsThemAlike) {
  // Grouped: a (constant 4), d (groups a graph input), e (transposed, its arguments in
  // conv_transpose2d's order). Left alone: b (groups 1) and c (padding "same").
  const std::string ir = R"IR(
graph(%x : Tensor, %w : Tensor, %w1 : Tensor, %wt : Tensor, %g : int):
  %none : NoneType = prim::Constant()
  %zero : int = prim::Constant[value=0]()
  %one : int = prim::Constant[value=1]()
  %two : int = prim::Constant[value=2]()
  %four : int = prim::Constant[value=4]()
  %false : bool = prim::Constant[value=0]()
  %same : str = prim::Constant[value="same"]()
  %l0 : int[] = prim::ListConstruct(%zero, %zero)
  %l1 : int[] = prim::ListConstruct(%one, %one)
  %l2 : int[] = prim::ListConstruct(%two, %two)
  %a : Tensor = aten::_convolution(%x, %w, %none, %l1, %l1, %l1, %false, %l0, %four, %false, %false, %false, %false)
  %b : Tensor = aten::conv2d(%a, %w1, %none, %l1, %l0, %l1, %one)
  %c : Tensor = aten::conv2d(%b, %w, %none, %l1, %same, %l1, %four)
  %d : Tensor = aten::conv2d(%c, %w, %none, %l2, %l1, %l1, %g)
  %e : Tensor = aten::conv_transpose2d(%d, %wt, %none, %l2, %l1, %l1, %four, %l2)
  return (%e))IR";
  auto original = std::make_shared<torch::jit::Graph>();
  torch::jit::parseIR(ir, original.get());
  auto rewritten = original->copy();
  EXPECT_EQ(ganc::frontend::rewriteGroupedConvolutions(*rewritten, false), 3U);
  // Each in place, naming the op it replaced (for autocast); b and c as they were.
  torch::jit::testing::FileCheck()
      .check("value=\"aten::_convolution\"")
      ->check_count("= ganc::convolution(", 1, /*exactly=*/true)
      ->check_count("= aten::conv2d(", 2, /*exactly=*/true)
      ->check("value=\"aten::conv2d\"")
      ->check_count("= ganc::convolution(", 1, /*exactly=*/true)
      ->check("value=\"aten::conv_transpose2d.input\"")
      ->check_count("= ganc::convolution(", 1, /*exactly=*/true)
      ->run(*rewritten);
  torch::jit::testing::FileCheck()
      .check_not("= aten::_convolution(")
      ->check_not("= aten::conv_transpose2d(")
      ->run(*rewritten);

  torch::manual_seed(2);
  const std::vector<c10::IValue> inputs{torch::randn({2, 4, 9, 9}), torch::randn({4, 1, 3, 3}),
                                        torch::randn({4, 4, 1, 1}), torch::randn({4, 1, 3, 3}),
                                        int64_t{4}};
  const auto run = [&](const std::shared_ptr<torch::jit::Graph> &graph) {
    torch::jit::GraphFunction function("rewrite_test", graph, nullptr);
    std::vector<c10::IValue> stack = inputs;
    function.run(stack);
    return stack.back().toTensor();
  };
  const at::Tensor want = run(original), got = run(rewritten);
  EXPECT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(torch::equal(got, want));
}

} // namespace
