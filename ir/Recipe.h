// A phase's recipe (how often it runs, its micro-batches, autocast, gradient clipping): what
// lowering writes into a new plan and `ganc train`'s overrides change in a compiled one, by
// the same functions.
#pragma once

#include "ir/Module.h"

#include <optional>
#include <string>
#include <vector>

namespace ganc::ir {

/// The autocast dtype of a spec precision: "" for "float32", "bf16" for "bfloat16", "f16" for
/// "float16".
std::string autocastOf(const std::string &precision);

/// The spec precision of an autocast dtype (the inverse of autocastOf).
std::string precisionOf(const std::string &autocast);

/// What changes of the recipe of the phases it is applied to; members left empty stay.
struct Recipe {
  std::optional<int64_t> interval;
  std::optional<int64_t> accumulate;
  std::optional<std::string> autocast;
};

/// Applies `recipe` to `phase`.
void setRecipe(Phase &phase, const Recipe &recipe);

/// Applies `recipe` to every phase of `plan` named `name` (each stage's specialisation), or to
/// every phase when `name` is empty; the number of phases changed.
size_t setRecipe(Module &plan, const std::string &name, const Recipe &recipe);

/// Clipping of optimizer group `group` (its clip_grad_norm_, or none when `clip` is empty) in
/// every phase that trains a parameter the group steps, in place of what the phase had.
void setClip(Module &plan, const std::string &group, const std::optional<ClipGradNorm> &clip);

} // namespace ganc::ir
