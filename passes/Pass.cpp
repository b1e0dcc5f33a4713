// The pass registry and the pipeline runner.
#include "passes/Pass.h"

namespace ganc::passes {

const std::vector<PassInfo> &allPasses() {
  static const std::vector<PassInfo> passes = {
#define GANC_PASS(NAME, FN, DESC) {NAME, &(FN), DESC},
#include "passes/Passes.def"
  };
  return passes;
}

const PassInfo *findPass(const std::string &name) {
  for (const PassInfo &info : allPasses())
    if (name == info.name)
      return &info;
  return nullptr;
}

std::vector<std::string> defaultPipeline() {
  std::vector<std::string> names;
  for (const PassInfo &info : allPasses())
    names.emplace_back(info.name);
  return names;
}

Status runPipeline(ir::Module &module, const std::vector<std::string> &names,
                   const PipelineOptions &options) {
  for (const std::string &name : names) {
    const PassInfo *info = findPass(name);
    if (!info)
      return Status::error("unknown pass '" + name + "'");
    auto changed = info->run(module, options.pass);
    if (!changed)
      return changed.status().withContext("pass " + name);
    // A broken invariant is ganc's bug; a broken model rule is the user's model.
    if (options.verifyEach)
      GANC_TRY(ir::verifyInvariants(module)
                   .withContext("IR invalid after pass " + name)
                   .as(ErrorKind::Internal));
    GANC_TRY(ir::verifyModelRules(module));
    if (options.afterPass)
      options.afterPass(name, module);
  }
  return Status::ok();
}

} // namespace ganc::passes
