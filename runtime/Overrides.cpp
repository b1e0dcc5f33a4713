#include "runtime/Overrides.h"

#include "ir/Recipe.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

namespace ganc::runtime {

namespace {

std::string join(const std::vector<std::string> &names) {
  std::string out;
  for (const std::string &n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

/// The plan's clipping of optimizer group `group` (every phase that trains it has the same).
std::optional<ir::ClipGradNorm> clipOf(const ir::Module &plan, const std::string &group) {
  for (const auto &phase : plan.phases)
    for (const ir::ClipGradNorm &clip : phase->clips)
      if (clip.group == group)
        return clip;
  return std::nullopt;
}

/// The command line's optimizer-group overrides: --lr and --betas in the spec, --clip in the
/// plan's phases.
Status overrideGroups(frontend::Spec &spec, ir::Module &plan, const TrainOptions &o) {
  auto groupNames = [&] {
    std::vector<std::string> names;
    for (const auto &[name, group] : spec.optimizers)
      names.push_back(name);
    return join(names);
  };
  auto groups = [&](const std::string &flag, const std::string &key,
                    std::vector<std::pair<std::string, frontend::OptimizerSpec *>> &out) {
    for (auto &[name, group] : spec.optimizers)
      if (key.empty() || key == name)
        out.emplace_back(name, &group);
    if (out.empty())
      return Status::error(flag + " " + key + "=: the spec has no optimizer group '" + key +
                           "' (groups: " + groupNames() + ")");
    return Status::ok();
  };
  for (const auto &[key, lr] : o.lr) {
    std::vector<std::pair<std::string, frontend::OptimizerSpec *>> targets;
    GANC_TRY(groups("--lr", key, targets));
    for (auto &[name, g] : targets)
      g->lr = lr;
  }
  for (const auto &[key, betas] : o.betas) {
    std::vector<std::pair<std::string, frontend::OptimizerSpec *>> targets;
    GANC_TRY(groups("--betas", key, targets));
    size_t adam = 0;
    for (auto &[name, g] : targets) {
      if (!g->hasBetas() && !key.empty())
        return Status::error("--betas " + key + "=: group '" + key + "' uses " + g->type +
                             ", which has no betas");
      if (!g->hasBetas())
        continue;
      g->beta1 = betas.first;
      g->beta2 = betas.second;
      ++adam;
    }
    if (adam == 0)
      return Status::error("--betas: no optimizer group uses Adam (groups: " + groupNames() + ")");
  }
  for (const auto &[key, limit] : o.clip) {
    std::vector<std::pair<std::string, frontend::OptimizerSpec *>> targets;
    GANC_TRY(groups("--clip", key, targets));
    for (auto &[name, g] : targets)
      ir::setClip(plan, name,
                  limit.first > 0
                      ? std::optional<ir::ClipGradNorm>({name, limit.first, limit.second})
                      : std::nullopt);
  }
  return Status::ok();
}

/// The command line's per-phase overrides (--precision, --accumulate, --interval): a phase's
/// in the plan (each stage's specialisation of it), a section's in the spec (no phase of the
/// plan), through the same ir::setRecipe that lowering uses.
Status overridePhases(frontend::Spec &spec, ir::Module &plan, const TrainOptions &o) {
  auto set = [&](const std::string &flag, const std::string &name, const ir::Recipe &recipe) {
    if (ir::setRecipe(plan, name, recipe) > 0)
      return Status::ok();
    for (frontend::PhaseSpec &p : spec.phases)
      if (p.name == name) { // a section
        p.interval = recipe.interval.value_or(p.interval);
        p.accumulate = recipe.accumulate.value_or(p.accumulate);
        if (recipe.autocast)
          p.precision = frontend::precisionOf(ir::precisionOf(*recipe.autocast));
        return Status::ok();
      }
    std::vector<std::string> names;
    for (const frontend::PhaseSpec &p : spec.phases)
      names.push_back(p.name);
    return Status::error(flag + " " + name + "=: the spec has no phase '" + name +
                         "' (phases: " + join(names) + ")");
  };
  for (const auto &[name, text] : o.precision) {
    ir::Recipe recipe;
    recipe.autocast = ir::autocastOf(text);
    if (name.empty()) { // every phase and section
      spec.precision = frontend::precisionOf(text);
      for (frontend::PhaseSpec &p : spec.phases)
        p.precision = spec.precision;
      ir::setRecipe(plan, "", recipe);
      continue;
    }
    GANC_TRY(set("--precision", name, recipe));
  }
  for (const auto &[name, k] : o.accumulate) {
    ir::Recipe recipe;
    recipe.accumulate = k;
    GANC_TRY(set("--accumulate", name, recipe));
  }
  for (const auto &[name, interval] : o.intervals) {
    ir::Recipe recipe;
    recipe.interval = interval;
    GANC_TRY(set("--interval", name, recipe));
  }
  return Status::ok();
}

} // namespace

PhaseRecipe recipeOf(const frontend::PhaseSpec &phase, const ir::Module &plan,
                     const std::string &stage) {
  for (const auto &planned : plan.phases)
    if (planned->name == phase.name && (stage.empty() || planned->stage == stage))
      return {planned->interval, planned->accumulate, planned->autocast, planned->lossScaler};
  return {phase.interval, phase.accumulate,
          ir::autocastOf(frontend::precisionName(phase.precision)), phase.lossScaler};
}

Status applyOverrides(frontend::Spec &spec, ir::Module &plan, const TrainOptions &o) {
  GANC_TRY(overrideGroups(spec, plan, o));
  if (o.batchSize > 0)
    spec.batchSize = o.batchSize;
  if (o.emaHalfLifeImages >= 0) {
    if (!spec.ema)
      return Status::error("--ema-half-life-images: the spec has no 'ema' (no G_ema to average)");
    spec.ema->halfLifeImages = o.emaHalfLifeImages;
    // 0 is "no averaging" (G_ema follows G), as documented; in the spec a half-life of 0
    // means "use 'beta'", which the option does not set.
    if (o.emaHalfLifeImages == 0)
      spec.ema->beta = 0;
  }
  GANC_TRY(overridePhases(spec, plan, o));
  if (!o.fuses()) // --fusion off (auto on the CPU): the phases run the ops as the archive wrote
                  // them
    for (const auto &phase : plan.phases) {
      phase->fusedResamplings = phase->fusedBiasActs = 0;
      phase->notFused.clear();
    }
  for (const auto &phase : plan.phases) // --double-backward: how the planned phases take it
    if (!phase->doubleBackward.empty())
      phase->doubleBackward = nameOf(o.doubleBackward, doubleBackwardNames());
  return ir::verifyInvariants(plan).withContext("the recipe given to ganc train");
}

std::map<std::string, std::string> trainingSettings(const frontend::Spec &spec,
                                                    const ir::Module &plan, uint64_t dataDigest,
                                                    double imagesPerStep) {
  std::map<std::string, std::string> settings;
  auto number = [](double v) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.9g", v);
    return std::string(text);
  };
  for (const auto &[name, g] : spec.optimizers) {
    settings["--lr " + name] = number(g.lr);
    if (g.hasBetas())
      settings["--betas " + name] = number(g.beta1) + "," + number(g.beta2);
    const auto clip = clipOf(plan, name);
    settings["--clip " + name] =
        clip ? number(clip->maxNorm) + "," + number(clip->normType) : "off";
  }
  for (const frontend::PhaseSpec &p : spec.phases) {
    const PhaseRecipe recipe = recipeOf(p, plan);
    settings["--accumulate " + p.name] = std::to_string(recipe.accumulate);
    settings["--precision " + p.name] = ir::precisionOf(recipe.autocast);
    settings["--interval " + p.name] = std::to_string(recipe.interval);
  }
  if (spec.ema) // the beta a step takes: the spec's, or the half-life's at this step's images
    settings["--ema-half-life-images"] =
        number(spec.ema->halfLifeImages) + " (beta " +
        number(spec.ema->halfLifeImages > 0
                   ? std::pow(0.5, imagesPerStep / spec.ema->halfLifeImages)
                   : spec.ema->beta) +
        ")";
  if (dataDigest) {
    char digest[32];
    std::snprintf(digest, sizeof(digest), "digest %016llx",
                  static_cast<unsigned long long>(dataDigest));
    settings["--data"] = digest;
  }
  return settings;
}

nlohmann::json effectiveSpec(const frontend::Spec &spec, const ir::Module &plan) {
  using nlohmann::json;
  json effective = json::parse(spec.text);
  for (const auto &[name, g] : spec.optimizers) {
    json &j = effective["optimizers"][name];
    j["type"] = g.type;
    j["lr"] = g.lr;
    if (g.hasBetas())
      j["betas"] = {g.beta1, g.beta2};
    if (const auto clip = clipOf(plan, name))
      j["clip_grad_norm"] = {
          {"max_norm", clip->maxNorm},
          {"norm_type", std::isinf(clip->normType) ? json("inf") : json(clip->normType)}};
    else
      j.erase("clip_grad_norm");
  }
  for (json &phase : effective["phases"])
    for (const frontend::PhaseSpec &p : spec.phases)
      if (phase.value("name", "") == p.name) {
        const PhaseRecipe recipe = recipeOf(p, plan);
        phase["interval"] = recipe.interval;
        phase["accumulate"] = recipe.accumulate;
        phase["precision"] = ir::precisionOf(recipe.autocast);
        if (!recipe.lossScaler.empty())
          phase["loss_scaler"] = recipe.lossScaler;
      }
  if (spec.ema) {
    effective["ema"]["half_life_images"] = spec.ema->halfLifeImages;
    effective["ema"]["beta"] = spec.ema->beta;
  }
  effective["batch_size"] = spec.batchSize;
  return effective;
}

} // namespace ganc::runtime
