// What the spec's readers share (Spec.cpp, SpecPhases.cpp): checks that say what is wrong in
// one line naming the field.
#pragma once

#include "frontend/Spec.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ganc::frontend::reading {

using nlohmann::json;

/// ok() when `condition` holds, else the error `message`.
Status need(bool condition, const std::string &message);

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
