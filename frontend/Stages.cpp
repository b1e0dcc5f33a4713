// Stage attributes and the stage-growth rule.
#include "frontend/Stages.h"

#include "frontend/Archive.h"

#include <set>

namespace ganc::frontend {

void setStageAttributes(torch::jit::Module &module, const StagesSpec &stages, size_t stage) {
  for (const std::string &path : stages.attributes) {
    auto [object, name] = resolvePath(module, path);
    object->setAttr(name, static_cast<int64_t>(stage));
  }
}

Status checkStageGrowth(const Spec &spec, const ir::Module &plan) {
  if (!spec.stages)
    return Status::ok();
  const auto &stages = spec.stages->list;
  std::vector<std::set<std::string>> usedIn;
  for (const StageSpec &stage : stages)
    usedIn.push_back(plan.usedInStage(stage.name));
  auto inBlock = [](const std::string &parameter, const std::string &block) {
    return parameter.compare(0, block.size() + 1, block + ".") == 0;
  };
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::set<std::string> &used = usedIn[i];
    for (const std::string &block : stages[i].grows) {
      std::string where = "stage '" + stages[i].name + "' grows '" + block + "'";
      bool hasParameters = false;
      for (const ir::Tensor &p : plan.parameters)
        hasParameters |= inBlock(p.name, block);
      if (!hasParameters)
        return Status::error(where + ", which has no parameters");
      bool usedNow = false;
      for (const std::string &p : used)
        usedNow |= inBlock(p, block);
      if (!usedNow)
        return Status::error(where + ", but none of the stage's phases uses its parameters");
      for (size_t j = 0; j < i; ++j)
        for (const std::string &p : usedIn[j])
          if (inBlock(p, block))
            return Status::error(where + ", but the earlier stage '" + stages[j].name +
                                 "' already uses '" + p + "'");
    }
  }
  return Status::ok();
}

} // namespace ganc::frontend
