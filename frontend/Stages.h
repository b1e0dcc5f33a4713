// Progressive growing: the stage attributes of a model, and the rule on what a stage grows.
#pragma once

#include "frontend/Spec.h"
#include "ir/Module.h"

#include <torch/script.h>

namespace ganc::frontend {

/// Sets every stage attribute of the module to `stage`, so that methods the runtime calls
/// unspecialised (the sample grid's forward) see the current stage.
void setStageAttributes(torch::jit::Module &module, const StagesSpec &stages, size_t stage);

/// After the passes ran: every block a stage `grows` is used by that stage's phases and by no
/// earlier stage's. Errors name the stage, the block and the parameter.
Status checkStageGrowth(const Spec &spec, const ir::Module &plan);

} // namespace ganc::frontend
