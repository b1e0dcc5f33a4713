// The IR's C++ API: building, printing, parsing back, verifying.
#include "ir/Module.h"
#include "ir/PhaseAttrs.h"
#include "ir/Recipe.h"
#include "passes/Pass.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace ganc;

namespace {

std::unique_ptr<ir::Module> twoLayerModule() {
  auto m = std::make_unique<ir::Module>();
  m->name = "built";
  m->parameters.push_back({"d.w", ir::Type::tensor("f32", {1, 4}), "d", "d"});
  m->parameters.push_back({"d.b", ir::Type::tensor("f32", {1}), "d", "d"});
  auto phase = std::make_unique<ir::Phase>();
  phase->name = "d";
  phase->method = "phase_d";
  phase->updates = {"d"};
  ir::Value *x = phase->newValue("x", ir::Type::tensor("f32", {8, 4}));
  phase->inputs.push_back({x, "data"});
  auto param = [&](const std::string &name, ir::Type type) {
    auto op = std::make_unique<ir::Op>();
    op->name = "ganc.param";
    op->symbol = name;
    ir::Value *v = phase->newValue(name.substr(2), type);
    v->definingOp = op.get();
    op->results.push_back(v);
    phase->body.ops.push_back(std::move(op));
    return v;
  };
  ir::Value *w = param("d.w", ir::Type::tensor("f32", {1, 4}));
  ir::Value *b = param("d.b", ir::Type::tensor("f32", {1}));
  auto linear = std::make_unique<ir::Op>();
  linear->name = "aten::linear";
  linear->operands = {x, w, b};
  linear->attributes.emplace_back("alpha", 0.1);
  linear->attributes.emplace_back("dims", std::vector<int64_t>{1, -2});
  linear->attributes.emplace_back("label", std::string("a \"quoted\" name"));
  ir::Value *out = phase->newValue("out", ir::Type::tensor("f32", {8, 1}));
  out->definingOp = linear.get();
  linear->results.push_back(out);
  phase->body.ops.push_back(std::move(linear));
  phase->loss = out;
  m->phases.push_back(std::move(phase));
  return m;
}

} // namespace

TEST(IRTest, PrintParsePrintIsIdentity) {
  auto m = twoLayerModule();
  ASSERT_TRUE(ir::verify(*m).isOk()) << ir::verify(*m).message();
  std::string text = ir::print(*m);
  auto parsed = ir::parse(text);
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  EXPECT_EQ(ir::print(**parsed), text);
}

TEST(IRTest, AnyNameRoundTrips) {
  // Names come from the user's module and spec: a space, unicode, '@', quotes, a newline, a
  // backslash or a lone '%' are printed quoted and read back the same.
  for (const std::string weird : {"d step", "g\xc3\xa9n\xc3\xa9rateur", "a@b", "say \"hi\"",
                                  "line\nbreak", "back\\slash", "%", "-x", "tab\there"}) {
    auto m = twoLayerModule();
    m->name = weird;
    for (ir::Tensor &p : m->parameters) {
      p.owner = weird;
      p.group = weird;
    }
    m->parameters[0].name = weird + ".w";
    ir::Phase &phase = *m->phases[0];
    phase.name = weird;
    phase.inputs[0].value->name = weird;
    phase.body.ops[0]->symbol = weird + ".w";
    phase.used = {weird + ".w"};
    phase.unused = {"d.b"};
    phase.hasUsedFacts = true;
    m->stages.push_back({weird, {weird}});
    const std::string text = ir::print(*m);
    auto parsed = ir::parse(text);
    ASSERT_TRUE(parsed.isOk()) << weird << ": " << parsed.status().message() << "\n" << text;
    EXPECT_EQ(ir::print(**parsed), text);
    const ir::Module &back = **parsed;
    EXPECT_EQ(back.name, weird);
    EXPECT_EQ(back.parameters[0].name, weird + ".w");
    EXPECT_EQ(back.parameters[0].owner, weird);
    EXPECT_EQ(back.parameters[1].group, weird);
    EXPECT_EQ(back.phases[0]->name, weird);
    EXPECT_EQ(back.phases[0]->inputs[0].value->name, weird);
    EXPECT_EQ(back.phases[0]->used, std::vector<std::string>{weird + ".w"});
    EXPECT_EQ(back.stages[0].grows, std::vector<std::string>{weird});
  }
}

TEST(IRTest, FactsSurviveRoundTrip) {
  auto m = twoLayerModule();
  passes::PipelineOptions options;
  ASSERT_TRUE(passes::runPipeline(*m, passes::defaultPipeline(), options).isOk());
  const ir::Phase &phase = *m->phases[0];
  EXPECT_EQ(phase.used, (std::vector<std::string>{"d.w", "d.b"}));
  ASSERT_EQ(phase.buckets.size(), 1u);
  EXPECT_EQ(phase.buckets[0].slots[1].offset, ir::kBucketAlignment);
  std::string text = ir::print(*m);
  auto parsed = ir::parse(text);
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  EXPECT_EQ(ir::print(**parsed), text);
  EXPECT_EQ((*parsed)->phases[0]->schedule.size(), 1u);
}

TEST(IRTest, TypesParseAndPrint) {
  for (const char *text : {"f32[64,3,?]", "tensor", "bf16[*]", "i64[]", "list<f32[2]>",
                           "tuple<int,optional<tensor>>", "object", "none"}) {
    auto type = ir::parseType(text);
    ASSERT_TRUE(type.isOk()) << text << ": " << type.status().message();
    EXPECT_EQ(type->str(), text);
  }
  EXPECT_FALSE(ir::parseType("f32[3").isOk());
  EXPECT_TRUE(ir::parseType("f32[2]")->mayCarryGradient());
  EXPECT_FALSE(ir::parseType("i64[2]")->mayCarryGradient());
  EXPECT_FALSE(ir::parseType("int")->mayCarryGradient());
  EXPECT_EQ(ir::parseType("f16[3,5]")->numel(), 15);
}

TEST(IRTest, VerifierRejectsUseBeforeDefinition) {
  auto m = twoLayerModule();
  auto &ops = m->phases[0]->body.ops;
  std::swap(ops.front(), ops.back()); // linear now precedes the param it reads
  Status status = ir::verify(*m);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("before it is defined"), std::string::npos) << status.message();
}

TEST(IRTest, ParserReportsLine) {
  auto parsed = ir::parse("module @m {\n  bogus\n}\n");
  ASSERT_FALSE(parsed.isOk());
  EXPECT_EQ(parsed.status().message().rfind("line 2:", 0), 0u) << parsed.status().message();
}

TEST(IRTest, StatusCarriesLocationInnermostFirst) {
  Status status = Status::error("shape mismatch")
                      .forParameter("g.w")
                      .atOp("aten::linear")
                      .inPhase("d@8x8")
                      .inPhase("g") // an outer caller does not override the inner phase
                      .inFile("model.pt")
                      .withContext("rank 1");
  EXPECT_EQ(status.location().phase, "d@8x8");
  EXPECT_EQ(status.location().parameter, "g.w");
  EXPECT_EQ(status.message(),
            "rank 1: model.pt: phase 'd@8x8': op aten::linear: parameter 'g.w': shape mismatch");
  EXPECT_EQ(status.as(ErrorKind::Runtime).message(), status.message());
  EXPECT_EQ(status.as(ErrorKind::Runtime).exitCode(), 1);
  EXPECT_TRUE(Status::ok().inPhase("d").isOk());
  EXPECT_EQ(Status::ok().inPhase("d").message(), "");
}

TEST(IRTest, VerifierNamesPhaseInLocation) {
  auto m = twoLayerModule();
  m->phases[0]->interval = 0;
  Status status = ir::verify(*m);
  ASSERT_FALSE(status.isOk());
  EXPECT_EQ(status.location().phase, m->phases[0]->key());
}

// Every row of ir/PhaseAttrs.def reads back what it printed, and a phase that sets all of them
// round-trips: a new attribute without a line here fails the first expectation.
TEST(IRTest, EveryPhaseAttributeRoundTrips) {
  const std::string text = R"IR(module @m {
  stage "8x8" grows [d]
  loss_scaler "s" init_scale 65536.0 growth_factor 2.0 backoff_factor 0.5 growth_interval 2000
  param @d.w : f32[1,4] owner d group d
  phase @d {
    method "phase_d"
    updates [d]
    interval 4
    stage "8x8"
    accumulate 2
    autocast bf16
    loss_scaler "s"
    through [fwd]
    outputs [fake]
    fused upfirdn2d 3 bias_act 5
    not_fused upfirdn2d "a learned filter (computed from a parameter) (d.py:12)"
    not_fused bias_act "a gain that is not a constant"
    double_backward grouped
    joint_grouped_convolutions 2
    bucket_cap 1048576 first 262144
    tuned ranks 8 exposed 0.25 default 0.5
    clip_grad_norm d max_norm 1.0 norm_type inf
    clip_grad_norm d max_norm 2.0 norm_type 2.0
    input %x : f32[8,4] from data
    graph {
      %w = ganc.param @d.w : f32[1,4]
      %out = aten::linear(%x, %w) : f32[8,1]
      return %out
    }
  }
}
)IR";
  for (const ir::PhaseAttr &attr : ir::phaseAttrs()) {
    EXPECT_NE(text.find("\n    " + std::string(attr.keyword) + " "), std::string::npos)
        << "no line of this test sets phase attribute '" << attr.keyword << "'";
    EXPECT_NE(std::string(attr.help), "") << attr.keyword;
  }
  auto parsed = ir::parse(text);
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  EXPECT_EQ(ir::print(**parsed), text);
  const ir::Phase &phase = *(*parsed)->phases[0];
  EXPECT_EQ(phase.interval, 4);
  EXPECT_EQ(phase.firstBucketCapBytes, 262144);
  EXPECT_EQ(phase.through, std::vector<std::string>{"fwd"});
  EXPECT_EQ(phase.outputs, std::vector<std::string>{"fake"});
  EXPECT_EQ(phase.doubleBackward, "grouped");
  EXPECT_EQ(phase.jointGroupedConvolutions, 2);
  ASSERT_EQ(phase.clips.size(), 2u);
  EXPECT_TRUE(std::isinf(phase.clips[0].maxNorm) || std::isinf(phase.clips[0].normType));
  EXPECT_EQ(phase.fusedResamplings, 3);
  EXPECT_EQ(phase.fusedBiasActs, 5);
  ASSERT_EQ(phase.notFused.size(), 2u);
  EXPECT_EQ(phase.notFused[0].why, "a learned filter (computed from a parameter) (d.py:12)");
}

// A table row's rule is the verifier's: a phase attribute out of range names the phase.
TEST(IRTest, PhaseAttributeRulesAreTheVerifiers) {
  auto m = twoLayerModule();
  m->phases[0]->accumulate = 0;
  Status status = ir::verify(*m);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("accumulate must be at least 1, got 0"), std::string::npos)
      << status.message();
  EXPECT_EQ(status.location().phase, "d");
}

TEST(IRTest, RecipeReachesEveryStageOfAPhaseAndClipsOnlyWhatTrainsTheGroup) {
  auto m = twoLayerModule();
  // A second stage's specialisation of "d", and a phase "g" that trains nothing of group d.
  for (const char *stage : {"s1", "s2"}) {
    auto copy = ir::parse(ir::print(*twoLayerModule()));
    ASSERT_TRUE(copy.isOk());
    std::unique_ptr<ir::Phase> phase = std::move((*copy)->phases[0]);
    phase->stage = stage;
    m->phases.push_back(std::move(phase));
  }
  m->phases[0]->name = "g";
  m->phases[0]->updates = {"g"};
  m->phases[0]->stage = "s1";
  m->stages = {{"s1", {}}, {"s2", {}}};
  m->parameters.push_back({"g.w", ir::Type::tensor("f32", {1}), "g", "g"});

  ir::Recipe recipe;
  recipe.interval = 4;
  recipe.autocast = ir::autocastOf("bfloat16");
  EXPECT_EQ(ir::setRecipe(*m, "d", recipe), 2u);
  for (const auto &phase : m->phases) {
    EXPECT_EQ(phase->interval, phase->name == "d" ? 4 : 1) << phase->key();
    EXPECT_EQ(phase->autocast, phase->name == "d" ? "bf16" : "") << phase->key();
    EXPECT_EQ(phase->accumulate, 1) << phase->key();
  }
  EXPECT_EQ(ir::setRecipe(*m, "nothing", recipe), 0u);
  EXPECT_EQ(ir::precisionOf(ir::autocastOf("float16")), "float16");
  EXPECT_EQ(ir::autocastOf("float32"), "");

  ir::setClip(*m, "d", ir::ClipGradNorm{"d", 1.5, INFINITY});
  for (const auto &phase : m->phases) {
    ASSERT_EQ(phase->clips.size(), phase->name == "d" ? 1u : 0u) << phase->key();
    if (phase->name == "d")
      EXPECT_EQ(phase->clips[0].maxNorm, 1.5);
  }
  ir::setClip(*m, "d", ir::ClipGradNorm{"d", 0.5, 2.0}); // replaces, never adds a second
  EXPECT_EQ(m->phases[1]->clips.size(), 1u);
  EXPECT_EQ(m->phases[1]->clips[0].maxNorm, 0.5);
  EXPECT_TRUE(ir::verifyInvariants(*m).isOk()) << ir::verifyInvariants(*m).message();
  ir::setClip(*m, "d", std::nullopt);
  for (const auto &phase : m->phases)
    EXPECT_TRUE(phase->clips.empty()) << phase->key();
}
