// The fusion rewrite (frontend/Fusion.cpp) on graphs written as the reference code traces:
// what it replaces (FileCheck), what it leaves alone and why, and the rewritten graph run
// against the graph it rewrote (ganc's ops against the reference compositions).
#include "frontend/Fusion.h"
#include "ops/Ops.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/testing/file_check.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

namespace jit = torch::jit;

// The constants every case uses, and a 4 x 4 filter that is not symmetric (a flip shows),
// computed from constants only (a constant filter, as a buffer is).
const char *kPrelude = R"IR(
  %none : NoneType = prim::Constant()
  %c0 : int = prim::Constant[value=0]()
  %c1 : int = prim::Constant[value=1]()
  %c2 : int = prim::Constant[value=2]()
  %c3 : int = prim::Constant[value=3]()
  %c4 : int = prim::Constant[value=4]()
  %c6 : int = prim::Constant[value=6]()
  %c16 : int = prim::Constant[value=16]()
  %big : int = prim::Constant[value=9223372036854775807]()
  %mode : str = prim::Constant[value="constant"]()
  %false : bool = prim::Constant[value=0]()
  %true : bool = prim::Constant[value=1]()
  %l0 : int[] = prim::ListConstruct(%c0, %c0)
  %l1 : int[] = prim::ListConstruct(%c1, %c1)
  %k : int[] = prim::ListConstruct(%c4, %c4)
  %ramp : Tensor = aten::arange(%c16, %c6, %none, %none, %none)
  %f : Tensor = aten::reshape(%ramp, %k)
  %f0 : Tensor = aten::unsqueeze(%f, %c0)
  %f1 : Tensor = aten::unsqueeze(%f0, %c1))IR";

std::shared_ptr<jit::Graph> parse(const std::string &signature, const std::string &body) {
  auto graph = std::make_shared<jit::Graph>();
  jit::parseIR(signature + kPrelude + body, graph.get());
  return graph;
}

at::Tensor run(const std::shared_ptr<jit::Graph> &graph, const std::vector<c10::IValue> &inputs) {
  jit::GraphFunction function("fusion_test", graph, nullptr);
  std::vector<c10::IValue> stack = inputs;
  function.run(stack);
  return stack.back().toTensor();
}

bool never(const jit::Value *) { return false; }

void expectClose(const at::Tensor &got, const at::Tensor &want) {
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-6 * want.abs().max().item<double>());
}

TEST(Fusion, TheReferenceUpsamplingBecomesOneResampling) {
  // StyleGAN's upsample2d on its reference path: zero insertion by reshape and pad, the
  // padding, the filter repeated over the channels, a depthwise convolution.
  auto graph = parse("graph(%x : Tensor):", R"IR(
  %n : int = aten::size(%x, %c0)
  %c : int = aten::size(%x, %c1)
  %h : int = aten::size(%x, %c2)
  %w : int = aten::size(%x, %c3)
  %six : int[] = prim::ListConstruct(%n, %c, %h, %c1, %w, %c1)
  %x6 : Tensor = aten::reshape(%x, %six)
  %zeros : int[] = prim::ListConstruct(%c0, %c1, %c0, %c0, %c0, %c1)
  %x6p : Tensor = aten::pad(%x6, %zeros, %mode, %none)
  %h2 : int = aten::mul(%h, %c2)
  %w2 : int = aten::mul(%w, %c2)
  %four : int[] = prim::ListConstruct(%n, %c, %h2, %w2)
  %xu : Tensor = aten::reshape(%x6p, %four)
  %pads : int[] = prim::ListConstruct(%c2, %c1, %c2, %c1)
  %xp : Tensor = aten::pad(%xu, %pads, %mode, %none)
  %reps : int[] = prim::ListConstruct(%c, %c1, %c1, %c1)
  %weight : Tensor = aten::repeat(%f1, %reps)
  %y : Tensor = aten::conv2d(%xp, %weight, %none, %l1, %l0, %l1, %c3)
  return (%y))IR");
  auto original = graph->copy();
  const ganc::frontend::FusionReport report = ganc::frontend::fuse(*graph, never);
  EXPECT_EQ(report.resamplings, 1);
  EXPECT_TRUE(report.nearMisses.empty());
  jit::testing::FileCheck()
      .check("= ganc::upfirdn2d(%x, ")
      ->check_not("aten::conv2d")
      ->check_not("aten::pad")
      ->run(*graph);
  jit::testing::FileCheck().check("int[] = prim::Constant[value=[2, 2]]")->run(*graph);
  const std::vector<c10::IValue> inputs{torch::randn({2, 3, 5, 6})};
  expectClose(run(graph, inputs), run(original, inputs));
}

TEST(Fusion, AStridedSliceAfterTheFilterIsTheDownsampling) {
  // downsample2d: padding, the filter, then x[:, :, ::2, ::2] (four slices, as a trace has it).
  auto graph = parse("graph(%x : Tensor):", R"IR(
  %c : int = aten::size(%x, %c1)
  %pads : int[] = prim::ListConstruct(%c1, %c1, %c1, %c1)
  %xp : Tensor = aten::pad(%x, %pads, %mode, %none)
  %reps : int[] = prim::ListConstruct(%c, %c1, %c1, %c1)
  %weight : Tensor = aten::repeat(%f1, %reps)
  %y : Tensor = aten::_convolution(%xp, %weight, %none, %l1, %l0, %l1, %false, %l0, %c3, %false, %false, %true, %true)
  %s0 : Tensor = aten::slice(%y, %c0, %c0, %big, %c1)
  %s1 : Tensor = aten::slice(%s0, %c1, %c0, %big, %c1)
  %s2 : Tensor = aten::slice(%s1, %c2, %c0, %big, %c2)
  %s3 : Tensor = aten::slice(%s2, %c3, %c0, %big, %c2)
  return (%s3))IR");
  auto original = graph->copy();
  EXPECT_EQ(ganc::frontend::fuse(*graph, never).resamplings, 1);
  jit::testing::FileCheck()
      .check("value=\"aten::_convolution\"")
      ->check("= ganc::upfirdn2d(%x, ")
      ->check_not("aten::slice")
      ->run(*graph);
  const std::vector<c10::IValue> inputs{torch::randn({2, 3, 9, 8})};
  expectClose(run(graph, inputs), run(original, inputs));
}

TEST(Fusion, OneChannelFiltersOfFoldedChannelsAreResamplingsToo) {
  // rosinality's upfirdn2d_native: the channels folded into the batch, one [1, 1, kh, kw]
  // filter, groups 1, the convolution's own padding.
  auto graph = parse("graph(%x : Tensor):", R"IR(
  %shape : int[] = prim::ListConstruct(%c1, %c1, %c4, %c4)
  %weight : Tensor = aten::view(%f, %shape)
  %y : Tensor = aten::conv2d(%x, %weight, %none, %l1, %l1, %l1, %c1)
  return (%y))IR");
  auto original = graph->copy();
  EXPECT_EQ(ganc::frontend::fuse(*graph, never).resamplings, 1);
  jit::testing::FileCheck().check("= ganc::upfirdn2d(%x, ")->check_not("aten::conv2d")->run(*graph);
  const std::vector<c10::IValue> inputs{torch::randn({6, 1, 7, 7})};
  expectClose(run(graph, inputs), run(original, inputs));
}

TEST(Fusion, ALearnedFilterIsLeftAloneAndSaidWhy) {
  auto graph = parse("graph(%x : Tensor, %learned : Tensor):", R"IR(
  %c : int = aten::size(%x, %c1)
  %g0 : Tensor = aten::unsqueeze(%learned, %c0)
  %g1 : Tensor = aten::unsqueeze(%g0, %c1)
  %reps : int[] = prim::ListConstruct(%c, %c1, %c1, %c1)
  %weight : Tensor = aten::repeat(%g1, %reps)
  %y : Tensor = aten::conv2d(%x, %weight, %none, %l1, %l1, %l1, %c3)
  return (%y))IR");
  const jit::Value *learned = graph->inputs()[1];
  const auto report =
      ganc::frontend::fuse(*graph, [&](const jit::Value *v) { return v == learned; });
  EXPECT_EQ(report.resamplings, 0);
  ASSERT_EQ(report.nearMisses.size(), 1U);
  EXPECT_EQ(report.nearMisses[0].pattern, "upfirdn2d");
  EXPECT_EQ(report.nearMisses[0].why, "a learned filter (computed from a parameter)");
  jit::testing::FileCheck().check("aten::conv2d")->check_not("ganc::upfirdn2d")->run(*graph);
}

TEST(Fusion, StyleGAN3sCropAndSeparableFilterBecomeTwoResamplings) {
  // StyleGAN3's reference upfirdn2d: a pad, a crop by slices whose ends are the padded size
  // less a constant (negative padding), then a 1-D filter as two depthwise passes (a row,
  // then a column) and a strided slice. Each pass becomes one resampling, the crop taken as
  // negative padding by the first, the stride by the second.
  auto graph = parse("graph(%x : Tensor):", R"IR(
  %c : int = aten::size(%x, %c1)
  %pads : int[] = prim::ListConstruct(%c3, %c0, %c2, %c1)
  %xp : Tensor = aten::pad(%x, %pads, %mode, %none)
  %hp : int = aten::size(%xp, %c2)
  %hp_t : Tensor = prim::NumToTensor(%hp)
  %hend_t : Tensor = aten::sub(%hp_t, %c2, %c1)
  %hend : int = aten::Int(%hend_t)
  %wp : int = aten::size(%xp, %c3)
  %wp_t : Tensor = prim::NumToTensor(%wp)
  %wend_t : Tensor = aten::sub(%wp_t, %c1, %c1)
  %wend : int = aten::Int(%wend_t)
  %s0 : Tensor = aten::slice(%xp, %c0, %c0, %big, %c1)
  %s1 : Tensor = aten::slice(%s0, %c1, %c0, %big, %c1)
  %s2 : Tensor = aten::slice(%s1, %c2, %c0, %hend, %c1)
  %s3 : Tensor = aten::slice(%s2, %c3, %c1, %wend, %c1)
  %taps : int = prim::Constant[value=5]()
  %ramp1 : Tensor = aten::arange(%taps, %c6, %none, %none, %none)
  %g0 : Tensor = aten::unsqueeze(%ramp1, %c0)
  %g1 : Tensor = aten::unsqueeze(%g0, %c1)
  %reps : int[] = prim::ListConstruct(%c, %c1, %c1)
  %g : Tensor = aten::repeat(%g1, %reps)
  %row : Tensor = aten::unsqueeze(%g, %c2)
  %y0 : Tensor = aten::conv2d(%s3, %row, %none, %l1, %l0, %l1, %c3)
  %column : Tensor = aten::unsqueeze(%g, %c3)
  %y1 : Tensor = aten::conv2d(%y0, %column, %none, %l1, %l0, %l1, %c3)
  %d0 : Tensor = aten::slice(%y1, %c2, %c0, %big, %c2)
  %y : Tensor = aten::slice(%d0, %c3, %c0, %big, %c2)
  return (%y))IR");
  auto original = graph->copy();
  const auto report = ganc::frontend::fuse(*graph, never);
  EXPECT_EQ(report.resamplings, 2);
  EXPECT_TRUE(report.nearMisses.empty());
  // The crop (x0 1, x1 1, y1 2) less the pad (3, 0, 2, 1): padding [2, -1, 2, -1].
  jit::testing::FileCheck()
      .check("prim::Constant[value=[2, -1, 2, -1]]")
      ->check("ganc::upfirdn2d(%x, ")
      ->check("ganc::upfirdn2d(")
      ->check_not("aten::conv2d")
      ->check_not("aten::slice")
      ->check_not("aten::pad")
      ->run(*graph);
  const std::vector<c10::IValue> inputs{torch::randn({2, 3, 9, 8})};
  expectClose(run(graph, inputs), run(original, inputs));
}

TEST(Fusion, AFilterMadeOnItsInputsDeviceIsConstant) {
  // torch.ones([1, 1], device=x.device) (StyleGAN3's upfirdn2d without a filter): where a
  // value is, not what it holds; the input it reads is computed from parameters.
  auto graph = parse("graph(%x : Tensor, %p : Tensor):", R"IR(
  %xw : Tensor = aten::mul(%x, %p)
  %c : int = aten::size(%xw, %c1)
  %dev : Device = prim::device(%xw)
  %shape : int[] = prim::ListConstruct(%c1, %c1)
  %ones : Tensor = aten::ones(%shape, %c6, %none, %dev, %none)
  %g0 : Tensor = aten::unsqueeze(%ones, %c0)
  %g1 : Tensor = aten::unsqueeze(%g0, %c1)
  %reps : int[] = prim::ListConstruct(%c, %c1, %c1, %c1)
  %weight : Tensor = aten::repeat(%g1, %reps)
  %pads : int[] = prim::ListConstruct(%c1, %c1, %c0, %c0)
  %xp : Tensor = aten::pad(%xw, %pads, %mode, %none)
  %y : Tensor = aten::conv2d(%xp, %weight, %none, %l1, %l0, %l1, %c3)
  return (%y))IR");
  const jit::Value *p = graph->inputs()[1];
  auto original = graph->copy();
  const auto report = ganc::frontend::fuse(*graph, [&](const jit::Value *v) { return v == p; });
  EXPECT_EQ(report.resamplings, 1);
  EXPECT_TRUE(report.nearMisses.empty());
  const std::vector<c10::IValue> inputs{torch::randn({2, 3, 4, 5}), torch::randn({1})};
  expectClose(run(graph, inputs), run(original, inputs));
}

TEST(Fusion, BiasActivationGainAndClampBecomeOneOp) {
  // bias_act's reference: x + b.reshape([1, -1, 1, 1]), leaky ReLU, * gain, clamp; and a
  // leaky ReLU times a gain without a bias. A bias added alone is left as it is.
  auto graph = parse("graph(%x : Tensor, %b : Tensor):", R"IR(
  %minus : int = prim::Constant[value=-1]()
  %bshape : int[] = prim::ListConstruct(%c1, %minus, %c1, %c1)
  %bb : Tensor = aten::reshape(%b, %bshape)
  %z : Tensor = aten::add(%x, %bb, %c1)
  %alpha : float = prim::Constant[value=0.2]()
  %a : Tensor = aten::leaky_relu(%z, %alpha)
  %gain : float = prim::Constant[value=1.4142135623730951]()
  %g : Tensor = aten::mul(%a, %gain)
  %lo : float = prim::Constant[value=-0.5]()
  %hi : float = prim::Constant[value=0.5]()
  %y : Tensor = aten::clamp(%g, %lo, %hi)
  %a2 : Tensor = aten::leaky_relu(%y, %alpha)
  %g2 : Tensor = aten::mul(%a2, %gain)
  %bb2 : Tensor = aten::reshape(%b, %bshape)
  %alone : Tensor = aten::add(%g2, %bb2, %c1)
  return (%alone))IR");
  auto original = graph->copy();
  const auto report = ganc::frontend::fuse(*graph, never);
  EXPECT_EQ(report.biasActs, 2);
  jit::testing::FileCheck()
      .check("= ganc::bias_act(%x, %b, ")
      ->check("\"lrelu\"")
      ->check("ganc::bias_act(")
      ->check("aten::add(")
      ->check_not("aten::leaky_relu")
      ->run(*graph);
  const std::vector<c10::IValue> inputs{torch::randn({2, 3, 4, 4}), torch::randn({3})};
  // The reference's operations in the reference's order: bit for bit in float32 on the CPU.
  EXPECT_TRUE(torch::equal(run(graph, inputs), run(original, inputs)));
  EXPECT_EQ(ganc::ops::table().size(), 5U); // the ops' library is the one the graph runs
}

} // namespace
