#include "ir/Recipe.h"

#include <algorithm>

namespace ganc::ir {

std::string autocastOf(const std::string &precision) {
  return precision == "bfloat16" ? "bf16" : precision == "float16" ? "f16" : "";
}

std::string precisionOf(const std::string &autocast) {
  return autocast == "bf16" ? "bfloat16" : autocast == "f16" ? "float16" : "float32";
}

void setRecipe(Phase &phase, const Recipe &recipe) {
  if (recipe.interval)
    phase.interval = *recipe.interval;
  if (recipe.accumulate)
    phase.accumulate = *recipe.accumulate;
  if (recipe.autocast)
    phase.autocast = *recipe.autocast;
}

size_t setRecipe(Module &plan, const std::string &name, const Recipe &recipe) {
  size_t changed = 0;
  for (const auto &phase : plan.phases)
    if (name.empty() || phase->name == name) {
      setRecipe(*phase, recipe);
      ++changed;
    }
  return changed;
}

void setClip(Module &plan, const std::string &group, const std::optional<ClipGradNorm> &clip) {
  for (const auto &phase : plan.phases) {
    auto &clips = phase->clips;
    clips.erase(std::remove_if(clips.begin(), clips.end(),
                               [&](const ClipGradNorm &c) { return c.group == group; }),
                clips.end());
    const bool steps =
        std::any_of(plan.parameters.begin(), plan.parameters.end(),
                    [&](const Tensor &t) { return t.group == group && phase->trains(t.name); });
    if (clip && steps) {
      ClipGradNorm added = *clip;
      added.group = group;
      // In group order, as lowering adds them.
      clips.insert(std::upper_bound(clips.begin(), clips.end(), added,
                                    [](const ClipGradNorm &a, const ClipGradNorm &b) {
                                      return a.group < b.group;
                                    }),
                   added);
    }
  }
}

} // namespace ganc::ir
