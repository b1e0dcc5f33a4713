// What `ganc train`'s command line changes of what a plan trains, and the record of it: the
// phase recipes (--precision, --accumulate, --interval, --clip, --fusion) are set in the plan,
// the rest (--lr, --betas, --batch-size, --ema-half-life-images) in its spec.
#pragma once

#include "frontend/Spec.h"
#include "ir/Module.h"
#include "runtime/Options.h"
#include "support/Status.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace ganc::runtime {

/// How a phase of the spec trains in stage `stage` ("" without stages: its first stage's,
/// which every stage shares): its plan phase's recipe; a section, which is no phase of the
/// plan, has its recipe in the plan's spec.
struct PhaseRecipe {
  int64_t interval = 1;
  int64_t accumulate = 1;
  std::string autocast; // "bf16", "f16" or "" (float32)
  std::string lossScaler;
};
PhaseRecipe recipeOf(const frontend::PhaseSpec &phase, const ir::Module &plan,
                     const std::string &stage = "");

/// The command line's hyper-parameters over the plan's and its spec's, each checked against
/// the groups and phases there are; the plan is verified again after.
Status applyOverrides(frontend::Spec &spec, ir::Module &plan, const TrainOptions &options);

/// The settings that shape what a run trains, keyed by the option that sets each ("--lr G",
/// "--betas G", "--clip G", "--accumulate d", "--precision d", "--interval d",
/// "--ema-half-life-images" with the beta a step of `imagesPerStep` images takes, "--data"), as
/// text: a checkpoint keeps them, and a resume with others is refused unless --accept-changes.
std::map<std::string, std::string> trainingSettings(const frontend::Spec &spec,
                                                    const ir::Module &plan, uint64_t dataDigest,
                                                    double imagesPerStep);

/// The spec as the run trains it: the archive's text with the plan's recipes and the command
/// line's values written in (run.json's `spec`).
nlohmann::json effectiveSpec(const frontend::Spec &spec, const ir::Module &plan);

} // namespace ganc::runtime
