// Where a joint program hands its gradients on: after the node a plan names, and never before
// the last node that reads or writes the gradient or a view of it (an in-place op on it here),
// which is refused naming both nodes.
#include "backend/JointProgram.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using ganc::JointGraph;
using ganc::JointPort;
using ganc::backend::JointProgram;

namespace {

/// loss = sum(x * w); the gradient of w is x * seed, doubled in place afterwards (so it is
/// complete only once `doubled` has run), then a node that does not touch it.
JointGraph graphWithAnInPlaceGradient() {
  JointGraph g;
  g.phase = "d";
  g.method = "phase_d";
  g.inputs = {{"w", "parameter", "w", {}, {2}, "float32"},
              {"x", "input", "x", {}, {2}, "float32"},
              {"seed", "seed", "loss", {}, {}, "float32"}};
  g.nodes = nlohmann::json::parse(R"([
    {"out": "grad", "op": "aten::mul", "overload": "Tensor", "args": [{"value": "x"}, {"value": "seed"}]},
    {"out": "doubled", "op": "aten::mul_", "overload": "Scalar", "args": [{"value": "grad"}, 2]},
    {"out": "prod", "op": "aten::mul", "overload": "Tensor", "args": [{"value": "x"}, {"value": "w"}]},
    {"out": "loss", "op": "aten::sum", "overload": "default", "args": [{"value": "prod"}]}
  ])");
  g.outputs = {{"loss", "loss", "loss", nlohmann::json("loss"), {}, ""},
               {"grad", "gradient", "w", nlohmann::json("grad"), {}, ""}};
  return g;
}

std::map<std::string, at::Tensor> inputs() {
  return {{"w", at::tensor({1.0F, 2.0F})},
          {"x", at::tensor({3.0F, 4.0F})},
          {"loss", at::ones({}, at::kFloat)}};
}

} // namespace

TEST(JointProgram, HandsAGradientOnWhereThePlanPlacesIt) {
  auto program = JointProgram::compile(graphWithAnInPlaceGradient(), {{{"doubled", {"w"}}}});
  ASSERT_TRUE(program) << program.status().message();
  std::vector<at::Tensor> handed;
  auto outputs = (*program)->run(inputs(), [&](const std::string &name, const at::Tensor &t) {
    EXPECT_EQ(name, "w");
    handed.push_back(t.clone()); // its value when handed on
  });
  ASSERT_TRUE(outputs) << outputs.status().message();
  ASSERT_EQ(handed.size(), 1U);
  EXPECT_TRUE(at::equal(handed[0], at::tensor({6.0F, 8.0F}))); // x * seed, doubled
  EXPECT_EQ((*outputs)[0].toTensor().item<float>(), 11.0F);    // 3 * 1 + 4 * 2
}

TEST(JointProgram, RefusesAPlanThatReducesAGradientBeforeItIsComplete) {
  auto program = JointProgram::compile(graphWithAnInPlaceGradient(), {{{"grad", {"w"}}}});
  ASSERT_FALSE(program);
  EXPECT_EQ(program.status().message(),
            "phase 'd': the plan reduces the gradient of 'w' after node grad, but node doubled "
            "still reads or writes it; compile the plan again");
}

TEST(JointProgram, RefusesAPlanThatMissesAGradientOrNamesNoNode) {
  auto none =
      JointProgram::compile(graphWithAnInPlaceGradient(), {std::vector<JointProgram::Launch>{}});
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().message(),
            "phase 'd': the plan reduces 0 of the 1 gradients its joint graph computes");
  auto unknown = JointProgram::compile(graphWithAnInPlaceGradient(), {{{"nowhere", {"w"}}}});
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.status().message(),
            "phase 'd': the plan reduces gradients after value 'nowhere', which no node of the "
            "joint graph makes");
}

TEST(JointProgram, WithoutAPlanHandsEachGradientOnAfterItsLastTouch) {
  auto program = JointProgram::compile(graphWithAnInPlaceGradient());
  ASSERT_TRUE(program) << program.status().message();
  std::vector<at::Tensor> handed;
  auto outputs = (*program)->run(
      inputs(), [&](const std::string &, const at::Tensor &t) { handed.push_back(t.clone()); });
  ASSERT_TRUE(outputs) << outputs.status().message();
  ASSERT_EQ(handed.size(), 1U);
  EXPECT_TRUE(at::equal(handed[0], at::tensor({6.0F, 8.0F})));
}
