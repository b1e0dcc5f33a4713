// Progressive growing: the stage attributes of a model. (The rule on what a stage grows is
// ir::verifyModelRules, checked on the IR after every pass.)
#pragma once

#include "frontend/Spec.h"
#include "ir/Module.h"

#include <torch/script.h>

namespace ganc::frontend {

/// Sets every stage attribute of the module to `stage`, so that methods the runtime calls
/// unspecialised (the sample grid's forward) see the current stage.
void setStageAttributes(torch::jit::Module &module, const StagesSpec &stages, size_t stage);

} // namespace ganc::frontend
