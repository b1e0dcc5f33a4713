// Ground truth for used-params: for every zoo model and phase, the statically computed used
// set equals the set of parameters that actually receive a gradient when the phase method
// runs under LibTorch autograd.
#include "frontend/Frontend.h"
#include "passes/Pass.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>

using namespace ganc;

namespace {

std::string modelPath(const std::string &name) {
  return std::string(GANC_TEST_MODELS_DIR) + "/" + name + ".pt";
}

/// Parameter names of `updates` that hold a gradient after one backward of the phase.
std::set<std::string> observedGradients(frontend::Archive &archive,
                                        const frontend::PhaseSpec &phase) {
  for (auto p : archive.module.parameters())
    p.mutable_grad() = at::Tensor();
  torch::manual_seed(0);
  std::vector<c10::IValue> inputs;
  for (const frontend::InputSpec &in : phase.inputs)
    inputs.emplace_back(frontend::exampleInput(archive.spec, in, archive.spec.batchSize));
  at::Tensor loss = archive.module.get_method(phase.method)(inputs).toTensor();
  loss.backward();
  std::set<std::string> got;
  for (const auto &p : archive.module.named_parameters()) {
    bool trained = std::any_of(phase.updates.begin(), phase.updates.end(),
                               [&](const std::string &u) { return ir::isWithin(p.name, u); });
    if (trained && p.value.grad().defined())
      got.insert(p.name);
  }
  return got;
}

/// A zoo archive, loaded, lowered and compiled with the default pipeline.
struct Compiled {
  frontend::Archive archive;
  std::unique_ptr<ir::Module> plan;
};

Compiled compileZoo(const std::string &name) {
  auto archive = frontend::loadArchive(modelPath(name));
  EXPECT_TRUE(archive.isOk()) << archive.status().message();
  if (!archive)
    return {};
  auto module = frontend::lowerToIR(*archive);
  EXPECT_TRUE(module.isOk()) << module.status().message();
  if (!module)
    return {};
  passes::PipelineOptions options;
  Status status = passes::runPipeline(**module, passes::defaultPipeline(), options);
  EXPECT_TRUE(status.isOk()) << status.message();
  return {archive.take(), module.take()};
}

class GroundTruth : public ::testing::TestWithParam<std::string> {};

} // namespace

TEST_P(GroundTruth, UsedSetEqualsAutogradGradients) {
  Compiled c = compileZoo(GetParam());
  ASSERT_TRUE(c.plan);
  // A progressive GAN: each stage's specialised plan against the unspecialised method run
  // with the stage attributes set to that stage.
  const auto &stages = c.archive.spec.stages;
  for (size_t s = 0; s < (stages ? stages->list.size() : 1); ++s) {
    std::string suffix;
    if (stages) {
      frontend::setStageAttributes(c.archive.module, *stages, s);
      suffix = "@" + stages->list[s].name;
    }
    for (const frontend::PhaseSpec &phase : c.archive.spec.phases) {
      SCOPED_TRACE("phase " + phase.name + suffix);
      const ir::Phase *compiled = c.plan->findPhase(phase.name + suffix);
      ASSERT_NE(compiled, nullptr);
      std::set<std::string> predicted(compiled->used.begin(), compiled->used.end());
      std::set<std::string> observed = observedGradients(c.archive, phase);
      std::string onlyPredicted, onlyObserved;
      // A conditional parameter (read only under a branch on data) may be missed by this one
      // run; the runtime checks those every step.
      const std::set<std::string> conditional(compiled->conditional.begin(),
                                              compiled->conditional.end());
      for (const std::string &p : predicted)
        if (!observed.count(p) && !conditional.count(p))
          onlyPredicted += " " + p;
      for (const std::string &p : observed)
        if (!predicted.count(p))
          onlyObserved += " " + p;
      EXPECT_EQ(onlyPredicted, "") << "predicted used, but autograd gives no gradient";
      EXPECT_EQ(onlyObserved, "") << "autograd gives a gradient, but predicted unused";
      EXPECT_FALSE(predicted.empty());
      // Every parameter under an `updates` path is either used or recorded as unused.
      EXPECT_EQ(compiled->used.size() + compiled->unused.size(), [&] {
        size_t n = 0;
        for (const auto &p : c.archive.module.named_parameters())
          n += std::any_of(phase.updates.begin(), phase.updates.end(),
                           [&](const std::string &u) { return ir::isWithin(p.name, u); });
        return n;
      }());
    }
  }
}

TEST(GroundTruthDCGAN, DPhaseUsesExactlyDAndGPhaseExactlyG) {
  Compiled c = compileZoo("dcgan32");
  ASSERT_TRUE(c.plan);
  for (const auto &[phaseName, owner] :
       {std::pair<std::string, std::string>{"d", "discriminator"}, {"g", "generator"}}) {
    const ir::Phase *phase = c.plan->findPhase(phaseName);
    ASSERT_NE(phase, nullptr);
    std::set<std::string> expected;
    for (const ir::Tensor &p : c.plan->parameters)
      if (p.owner == owner)
        expected.insert(p.name);
    EXPECT_EQ(std::set<std::string>(phase->used.begin(), phase->used.end()), expected);
    EXPECT_TRUE(phase->unused.empty());
  }
}

TEST(GroundTruthProbe, UnusedHeadAndUntakenBranchAreRecorded) {
  Compiled c = compileZoo("probe_aux");
  ASSERT_TRUE(c.plan);
  const ir::Phase *d = c.plan->findPhase("d");
  std::set<std::string> unused(d->unused.begin(), d->unused.end());
  EXPECT_EQ(unused, (std::set<std::string>{
                        "discriminator.never_used.weight", "discriminator.never_used.bias",
                        "discriminator.skipped.weight", "discriminator.skipped.bias"}));
  // The in-place `h.mul_(self.scale)` is seen: scale is used.
  EXPECT_NE(std::find(d->used.begin(), d->used.end(), "discriminator.scale"), d->used.end());
}

INSTANTIATE_TEST_SUITE_P(Zoo, GroundTruth,
                         ::testing::Values("dcgan32", "dcgan64", "mlp", "mlp_traced",
                                           "probe_nograd", "probe_aux", "probe_sync", "wgan_gp",
                                           "cyclegan", "r1gan", "sngan", "mlp_ema", "cdcgan32",
                                           "pggan", "stylegan2", "sndcgan32", "dcgan32_augment",
                                           "dcgan32_freezed", "mlp_temperature", "mlp_branch",
                                           "biggan32"));
