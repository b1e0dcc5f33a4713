// The spec's optimizer groups ('optimizers'): each group's type and torch.optim settings, its
// gradient clipping, learning-rate schedule and weight clamp (see SpecFields.def).
#include "frontend/Spec.h"
#include "frontend/SpecReading.h"
#include "frontend/SpecSchema.h"

#include "ir/Module.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace ganc::frontend::reading {

namespace {

/// 'clip_grad_norm': {"max_norm": x, "norm_type": p}, as torch.nn.utils.clip_grad_norm_.
Status parseClip(const json &j, const std::string &where, OptimizerSpec &o) {
  GANC_TRY(checkObject(j, "clip", where + ": clip_grad_norm: "));
  GANC_TRY(need(j.is_object() && j.contains("max_norm"),
                where + ": 'clip_grad_norm' needs a positive 'max_norm'"));
  ClipSpec clip;
  clip.maxNorm = j["max_norm"].get<double>();
  const json &p = j.value("norm_type", json(clip.normType));
  clip.normType = p.is_string() ? std::numeric_limits<double>::infinity() : p.get<double>();
  o.clip = clip;
  return Status::ok();
}

/// 'lr_schedule': {"type": ..., and that torch.optim.lr_scheduler class's arguments}.
Status parseSchedule(const json &j, const std::string &where, OptimizerSpec &o) {
  const std::string at = where + ": lr_schedule: ";
  GANC_TRY(need(j.is_object() && j.contains("type"), at + "needs a 'type'"));
  GANC_TRY(checkValue(j["type"], "schedule", "type", at));
  LrScheduleSpec s;
  s.type = j["type"].get<std::string>();
  static const std::map<std::string, std::vector<std::string>> kKeys = {
      {"constant", {"type", "factor", "total_iters"}},
      {"linear", {"type", "start_factor", "end_factor", "total_iters"}},
      {"step", {"type", "step_size", "gamma"}},
      {"cosine", {"type", "t_max", "eta_min"}},
      {"exponential", {"type", "gamma"}}};
  GANC_TRY(knownKeys(j, kKeys.at(s.type), at)); // every type the schema names has a row
  GANC_TRY(checkObject(j, "schedule", at));
  s.factor = j.value("factor", s.factor);
  s.startFactor = j.value("start_factor", s.startFactor);
  s.endFactor = j.value("end_factor", s.endFactor);
  s.totalIters = j.value("total_iters", s.totalIters);
  s.stepSize = j.value("step_size", s.stepSize);
  s.gamma = j.value("gamma", s.gamma);
  s.tMax = j.value("t_max", s.tMax);
  s.etaMin = j.value("eta_min", s.etaMin);
  const char *needed = s.type == "step"          ? "step_size"
                       : s.type == "cosine"      ? "t_max"
                       : s.type == "exponential" ? "gamma"
                                                 : nullptr;
  GANC_TRY(
      need(!needed || j.contains(needed), at + s.type + " needs '" + (needed ? needed : "") + "'"));
  o.schedule = s;
  return Status::ok();
}

/// The settings of one optimizer type (amsgrad; nesterov, dampening; alpha, centered) and the
/// weight clamp; a setting of another type is refused naming it.
Status parseVariant(const json &j, const std::string &where, OptimizerSpec &o) {
  static const std::map<std::string, std::vector<std::string>> owners = {
      {"amsgrad", {"adam", "adamw"}},
      {"nesterov", {"sgd"}},
      {"dampening", {"sgd"}},
      {"alpha", {"rmsprop"}},
      {"centered", {"rmsprop"}}};
  for (const auto &[key, types] : owners)
    GANC_TRY(need(!j.contains(key) || std::count(types.begin(), types.end(), o.type) > 0,
                  where + ": '" + key + "' is a setting of " + types.front() +
                      (types.size() > 1 ? " and " + types.back() : "") + ", not of " + o.type));
  o.amsgrad = j.value("amsgrad", o.amsgrad);
  o.nesterov = j.value("nesterov", o.nesterov);
  o.dampening = j.value("dampening", o.dampening);
  o.alpha = j.value("alpha", o.alpha);
  o.centered = j.value("centered", o.centered);
  GANC_TRY(need(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                where + ": nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)"));
  if (j.contains("clamp_weights"))
    o.clampWeights = j["clamp_weights"].get<double>();
  return Status::ok();
}

Status parseOptimizer(const std::string &group, const json &j, OptimizerSpec &o) {
  std::string where = "optimizer of '" + group + "'";
  GANC_TRY(checkObject(j, "optimizer", where + ": "));
  GANC_TRY(need(j.is_object() && j.contains("type"), where + " needs a 'type'"));
  o.params = {group};
  if (j.contains("params")) {
    GANC_TRY(need(j["params"].is_array() && !j["params"].empty(),
                  where + ": 'params' must list submodule or parameter paths"));
    o.params.clear();
    for (const json &path : j["params"]) {
      GANC_TRY(
          need(path.is_string() && isPath(path.get<std::string>()),
               where + ": 'params' must list submodule or parameter paths, got " + path.dump()));
      o.params.push_back(path.get<std::string>());
    }
  }
  o.type = j["type"].get<std::string>();
  o.weightDecay = o.type == "adamw" ? 1e-2 : 0.0;
  o.lr = o.type == "sgd" || o.type == "rmsprop" ? 1e-2 : 2e-4;
  o.lr = j.value("lr", o.lr);
  if (j.contains("betas")) {
    o.beta1 = j["betas"][0].get<double>();
    o.beta2 = j["betas"][1].get<double>();
  }
  o.eps = j.value("eps", o.eps);
  o.weightDecay = j.value("weight_decay", o.weightDecay);
  o.momentum = j.value("momentum", o.momentum);
  GANC_TRY(parseVariant(j, where, o));
  if (j.contains("clip_grad_norm"))
    GANC_TRY(parseClip(j["clip_grad_norm"], where, o));
  if (j.contains("lr_schedule"))
    GANC_TRY(parseSchedule(j["lr_schedule"], where, o));
  return Status::ok();
}

} // namespace

Status parseOptimizers(const json &optimizers, Spec &spec) {
  GANC_TRY(need(optimizers.is_object(), "'optimizers' must map group names to settings"));
  const std::vector<std::string> updated = spec.updatedPaths();
  for (const auto &[group, o] : optimizers.items()) {
    const std::string where = "optimizer of '" + group + "': ";
    GANC_TRY(need(isPath(group),
                  "optimizer group '" + group + "': names hold letters, digits, '_' and '.'"));
    GANC_TRY(needVersion(spec.version, o, "optimizer", where));
    OptimizerSpec opt;
    GANC_TRY(parseOptimizer(group, o, opt));
    for (const std::string &path : opt.params)
      GANC_TRY(need(std::any_of(updated.begin(), updated.end(),
                                [&](const std::string &u) {
                                  return ir::isWithin(path, u) || ir::isWithin(u, path);
                                }),
                    where + "no phase updates '" + path + "' or anything in it"));
    spec.optimizers[group] = opt;
  }
  return Status::ok();
}

} // namespace ganc::frontend::reading
