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
  GANC_TRY(knownKeys(j, "clip", where + ": clip_grad_norm: "));
  GANC_TRY(need(j.is_object() && j.contains("max_norm") && j["max_norm"].is_number() &&
                    j["max_norm"].get<double>() > 0,
                where + ": 'clip_grad_norm' needs a positive 'max_norm'"));
  ClipSpec clip;
  clip.maxNorm = j["max_norm"].get<double>();
  if (j.contains("norm_type")) {
    const json &p = j["norm_type"];
    if (p.is_string() && p.get<std::string>() == "inf")
      clip.normType = std::numeric_limits<double>::infinity();
    else if (p.is_number() && p.get<double>() > 0)
      clip.normType = p.get<double>();
    else
      return Status::error(where +
                           ": 'clip_grad_norm.norm_type' must be a positive number or "
                           "\"inf\", got " +
                           p.dump());
  }
  o.clip = clip;
  return Status::ok();
}

/// 'lr_schedule': {"type": ..., and that torch.optim.lr_scheduler class's arguments}.
Status parseSchedule(const json &j, const std::string &where, OptimizerSpec &o) {
  const std::string at = where + ": lr_schedule: ";
  GANC_TRY(need(j.is_object() && j.contains("type") && j["type"].is_string(),
                at + "needs a 'type' (constant, linear, step, cosine or exponential)"));
  LrScheduleSpec s;
  s.type = j["type"].get<std::string>();
  static const std::map<std::string, std::vector<std::string>> kKeys = {
      {"constant", {"type", "factor", "total_iters"}},
      {"linear", {"type", "start_factor", "end_factor", "total_iters"}},
      {"step", {"type", "step_size", "gamma"}},
      {"cosine", {"type", "t_max", "eta_min"}},
      {"exponential", {"type", "gamma"}}};
  auto keys = kKeys.find(s.type);
  GANC_TRY(need(keys != kKeys.end(), at + "unknown type '" + s.type +
                                         "' (constant, linear, step, cosine or exponential)"));
  GANC_TRY(knownKeys(j, keys->second, at));
  GANC_TRY(field(j, "factor", s.factor, at));
  GANC_TRY(field(j, "start_factor", s.startFactor, at));
  GANC_TRY(field(j, "end_factor", s.endFactor, at));
  GANC_TRY(field(j, "total_iters", s.totalIters, at));
  GANC_TRY(field(j, "step_size", s.stepSize, at));
  GANC_TRY(field(j, "gamma", s.gamma, at));
  GANC_TRY(field(j, "t_max", s.tMax, at));
  GANC_TRY(field(j, "eta_min", s.etaMin, at));
  if (s.type == "exponential")
    GANC_TRY(need(j.contains("gamma"), at + "exponential needs 'gamma'"));
  GANC_TRY(need(s.factor > 0 && s.factor <= 1, at + "factor must be in (0, 1]"));
  GANC_TRY(need(s.startFactor > 0 && s.startFactor <= 1 && s.endFactor >= 0 && s.endFactor <= 1,
                at + "start_factor must be in (0, 1] and end_factor in [0, 1]"));
  GANC_TRY(need(s.totalIters >= 0, at + "total_iters must be >= 0"));
  GANC_TRY(need(s.type != "step" || s.stepSize >= 1, at + "step needs 'step_size' >= 1"));
  GANC_TRY(need(s.type != "cosine" || s.tMax >= 1, at + "cosine needs 't_max' >= 1"));
  GANC_TRY(need(s.gamma > 0 && s.etaMin >= 0, at + "gamma must be > 0 and eta_min >= 0"));
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
  GANC_TRY(field(j, "amsgrad", o.amsgrad, where + ": "));
  GANC_TRY(field(j, "nesterov", o.nesterov, where + ": "));
  GANC_TRY(field(j, "dampening", o.dampening, where + ": "));
  GANC_TRY(field(j, "alpha", o.alpha, where + ": "));
  GANC_TRY(field(j, "centered", o.centered, where + ": "));
  GANC_TRY(need(o.dampening >= 0 && o.dampening <= 1, where + ": dampening must be in [0, 1]"));
  GANC_TRY(need(o.alpha >= 0 && o.alpha < 1, where + ": alpha must be in [0, 1)"));
  GANC_TRY(need(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                where + ": nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)"));
  if (j.contains("clamp_weights")) {
    double c = 0;
    GANC_TRY(field(j, "clamp_weights", c, where + ": "));
    GANC_TRY(need(c > 0, where + ": clamp_weights must be positive"));
    o.clampWeights = c;
  }
  return Status::ok();
}

Status parseOptimizer(const std::string &group, const json &j, OptimizerSpec &o) {
  std::string where = "optimizer of '" + group + "'";
  GANC_TRY(knownKeys(j, "optimizer", where + ": "));
  GANC_TRY(need(j.is_object() && j.contains("type") && j["type"].is_string(),
                where + " needs a 'type'"));
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
  GANC_TRY(need(o.type == "adam" || o.type == "adamw" || o.type == "sgd" || o.type == "rmsprop",
                where + " has type '" + o.type + "', expected adam, adamw, sgd or rmsprop"));
  o.weightDecay = o.type == "adamw" ? 1e-2 : 0.0;
  o.lr = o.type == "sgd" || o.type == "rmsprop" ? 1e-2 : 2e-4;
  GANC_TRY(field(j, "lr", o.lr, where + ": "));
  GANC_TRY(need(o.lr > 0, where + ": lr must be positive"));
  if (j.contains("betas")) {
    GANC_TRY(need(j["betas"].is_array() && j["betas"].size() == 2 && j["betas"][0].is_number() &&
                      j["betas"][1].is_number(),
                  where + ": betas must be two numbers"));
    o.beta1 = j["betas"][0].get<double>();
    o.beta2 = j["betas"][1].get<double>();
    GANC_TRY(need(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
                  where + ": betas must be in [0, 1)"));
  }
  GANC_TRY(field(j, "eps", o.eps, where + ": "));
  GANC_TRY(field(j, "weight_decay", o.weightDecay, where + ": "));
  GANC_TRY(field(j, "momentum", o.momentum, where + ": "));
  GANC_TRY(need(o.eps >= 0, where + ": eps must be >= 0"));
  GANC_TRY(need(o.weightDecay >= 0, where + ": weight_decay must be >= 0"));
  GANC_TRY(need(o.momentum >= 0, where + ": momentum must be >= 0"));
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
