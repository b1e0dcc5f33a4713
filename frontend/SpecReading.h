// What the spec's readers share (Spec.cpp, SpecPhases.cpp): checks that say what is wrong in
// one line naming the field.
#pragma once

#include "frontend/Spec.h"

#include <nlohmann/json.hpp>

#include <string>
#include <type_traits>
#include <vector>

namespace ganc::frontend::reading {

using nlohmann::json;

/// ok() when `condition` holds, else the error `message`.
Status need(bool condition, const std::string &message);

/// Reads the optional field `key` of `j` into `out` (left as it is when absent), checking its
/// JSON type: a number for double, an integer for int and int64_t, a string for std::string. The
/// error names the field.
template <typename T>
Status field(const json &j, const char *key, T &out, const std::string &where) {
  if (!j.is_object() || !j.contains(key))
    return Status::ok();
  const json &v = j[key];
  bool ok = false;
  // bool before the other integral types: it is one of them.
  if constexpr (std::is_same_v<T, double>)
    ok = v.is_number();
  else if constexpr (std::is_same_v<T, bool>)
    ok = v.is_boolean();
  else if constexpr (std::is_integral_v<T>)
    ok = v.is_number_integer();
  else
    ok = v.is_string();
  const char *expected = std::is_same_v<T, double> ? "a number"
                         : std::is_same_v<T, bool> ? "true or false"
                         : std::is_integral_v<T>   ? "an integer"
                                                   : "a string";
  if (!ok)
    return Status::error(where + "'" + key + "' must be " + expected + ", got " + v.dump());
  out = v.get<T>();
  return Status::ok();
}

/// A list of positive integers (a shape); the error names `where`.
Expected<std::vector<int64_t>> shapeOf(const json &j, const std::string &where);
/// A path in `updates` or `params`: dotted attribute names ("discriminator.head").
bool isPath(const std::string &path);

/// The optimizer groups ('optimizers'). Checks what needs no module: each group's paths lie
/// within, or hold, a path some phase updates. loadArchive resolves the paths against the
/// module and adds the default groups.
Status parseOptimizers(const json &optimizers, Spec &spec);
/// One phase: name, method, interval, what it trains, its inputs and outputs, its
/// training-step fields. `hasStages`: whether the spec declares stages.
Status parsePhase(const json &p, const Spec &spec, bool hasStages, PhaseSpec &phase);
/// What the sample grid draws ('sample'): a submodule on noise, or a method on inputs.
Status parseSample(const json &s, Spec &spec);
/// The controllers ('controllers'), once the phases are read.
Status parseControllers(const json &j, Spec &spec);
/// Every `controller` input names a controller.
Status checkControllerInputs(const Spec &spec);
/// The values phases hand each other within a step (`outputs`, `output` inputs): each is
/// computed by an earlier phase that runs whenever its taker does, with as many
/// micro-batches; a graph is taken by one phase only, from a section.
Status checkSharedValues(const Spec &spec);

} // namespace ganc::frontend::reading
