// Stage attributes.
#include "frontend/Stages.h"

#include "frontend/Archive.h"

namespace ganc::frontend {

void setStageAttributes(torch::jit::Module &module, const StagesSpec &stages, size_t stage) {
  for (const std::string &path : stages.attributes) {
    auto [object, name] = resolvePath(module, path);
    object->setAttr(name, static_cast<int64_t>(stage));
  }
}

} // namespace ganc::frontend
