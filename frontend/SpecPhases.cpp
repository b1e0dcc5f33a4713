// Reads the spec's phases and their inputs, and checks the values phases hand each other.
#include "frontend/SpecReading.h"
#include "frontend/SpecSchema.h"

#include <algorithm>
#include <map>
#include <set>

namespace ganc::frontend::reading {

namespace {

/// One phase input; `where` names the phase, `hasStages` whether the spec declares stages.
Status parseInput(const json &in, const Spec &spec, bool hasStages, const std::string &where,
                  InputSpec &input) {
  GANC_TRY(need(in.is_object() && in.contains("name"), where + ": every input needs a 'name'"));
  GANC_TRY(checkValue(in["name"], "input", "name", where + ": input: "));
  input.name = in["name"].get<std::string>();
  const std::string at = where + ": input '" + input.name + "'";
  GANC_TRY(checkObject(in, "input", at + ": "));
  GANC_TRY(needVersion(spec.version, in, "input", at + ": "));
  GANC_TRY(need(in.contains("source"), at + " needs a 'source'"));
  const std::string source = in["source"].get<std::string>();
  input.source = *parseInputSource(source);
  GANC_TRY(need(input.source == InputSource::Output ||
                    (!in.contains("output") && !in.contains("detach")),
                at + ": 'output' and 'detach' belong to inputs of source 'output'"));
  GANC_TRY(need(input.source == InputSource::Data || !in.contains("field"),
                at + ": 'field' belongs to inputs of source 'data'"));
  GANC_TRY(need((input.source == InputSource::Controller) == in.contains("controller"),
                at + ": an input of source 'controller' names its 'controller', and only it"));
  if (input.source == InputSource::Controller) {
    input.controller = in.value("controller", input.controller);
  } else if (input.source == InputSource::Output) {
    std::string output;
    output = in.value("output", output);
    const size_t dot = output.rfind('.');
    GANC_TRY(need(dot != std::string::npos && dot > 0 && dot + 1 < output.size(),
                  at + " takes an earlier phase's value: set 'output' to \"PHASE.NAME\" "
                       "(\"forward.fake\")"));
    input.producer = output.substr(0, dot);
    input.value = output.substr(dot + 1);
    input.detach = in.value("detach", input.detach);
  } else if (input.source == InputSource::Fade) {
    GANC_TRY(need(hasStages, at + " reads the fade-in weight: declare 'stages'"));
  } else if (input.isClassIds()) {
    input.classes = spec.dataClasses;
    input.classes = in.value("classes", input.classes);
    GANC_TRY(need(input.classes > 0, at + " needs 'classes' (or 'data.classes')"));
    GANC_TRY(need(input.source != InputSource::Labels || spec.dataClasses > 0,
                  at + " reads labels: set 'data.classes'"));
  } else if (input.source == InputSource::Data) {
    input.field = in.value("field", input.field);
    if (spec.dataFields.empty())
      GANC_TRY(need(input.field.empty(),
                    at + " takes field '" + input.field + "': 'data' declares no 'fields'"));
    else
      GANC_TRY(need(spec.dataField(input.field) != nullptr,
                    at +
                        (input.field.empty() ? std::string(" takes the data: name one of its")
                                             : " takes field '" + input.field + "', not one of") +
                        " fields (" + fieldNames(spec.dataFields) + ") in 'field'"));
  } else {
    GANC_TRY(need(in.contains("shape"),
                  where + ": " + source + " input '" + input.name + "' needs a 'shape'"));
    auto shape = shapeOf(in["shape"], at + " shape");
    if (!shape)
      return shape.status();
    input.shape = shape.take();
  }
  return Status::ok();
}

/// `updates` (empty for a section) and `outputs`.
Status parseUpdatesAndOutputs(const json &p, const std::string &where, PhaseSpec &phase) {
  const json &updates = p.value("updates", json::array());
  GANC_TRY(need(updates.is_array(),
                where + ": 'updates' must list the submodules or parameters it trains"));
  for (const json &u : updates) {
    GANC_TRY(need(u.is_string() && isPath(u.get<std::string>()),
                  where + ": 'updates' must hold submodule or parameter paths"));
    phase.updates.push_back(u.get<std::string>());
  }
  const json &outputs = p.value("outputs", json::array());
  GANC_TRY(need(outputs.is_array(), where + ": 'outputs' must list names"));
  for (const json &o : outputs) {
    GANC_TRY(need(o.is_string() && isPath(o.get<std::string>()) &&
                      o.get<std::string>().find('.') == std::string::npos,
                  where + ": 'outputs' must hold names (letters, digits, '_'), got " + o.dump()));
    GANC_TRY(need(std::find(phase.outputs.begin(), phase.outputs.end(), o.get<std::string>()) ==
                      phase.outputs.end(),
                  where + ": output '" + o.get<std::string>() + "' is declared twice"));
    phase.outputs.push_back(o.get<std::string>());
  }
  GANC_TRY(need(!phase.updates.empty() || !phase.outputs.empty(),
                where + ": 'updates' must list the submodules or parameters it trains (a phase "
                        "that trains nothing is a section: it lists its 'outputs')"));
  return Status::ok();
}

} // namespace

Status parsePhase(const json &p, const Spec &spec, bool hasStages, PhaseSpec &phase) {
  GANC_TRY(need(p.is_object() && p.contains("name"), "every phase needs a 'name'"));
  GANC_TRY(checkValue(p["name"], "phase", "name", "phase: "));
  phase.name = p["name"].get<std::string>();
  std::string where = "phase '" + phase.name + "'";
  GANC_TRY(checkObject(p, "phase", where + ": "));
  GANC_TRY(need(p.contains("method"), where + " needs a 'method'"));
  phase.method = p["method"].get<std::string>();
  phase.interval = p.value("interval", phase.interval);
  GANC_TRY(needVersion(spec.version, p, "phase", where + ": "));
  GANC_TRY(parseUpdatesAndOutputs(p, where, phase));
  std::set<std::string> inputNames;
  for (const json &in : p.value("inputs", json::array())) {
    InputSpec input;
    GANC_TRY(parseInput(in, spec, hasStages, where, input));
    GANC_TRY(need(inputNames.insert(input.name).second,
                  where + ": input '" + input.name + "' is declared twice"));
    phase.inputs.push_back(input);
  }
  if (p.contains("loss_scaler")) {
    GANC_TRY(need(!phase.isSection(), where + ": a section has no loss to scale"));
    GANC_TRY(need(spec.lossScalers.count(p["loss_scaler"].get<std::string>()) > 0,
                  where + ": 'loss_scaler' " + p["loss_scaler"].dump() +
                      " is not one of the spec's 'loss_scalers'"));
    phase.lossScaler = p["loss_scaler"].get<std::string>();
  }
  phase.accumulate = p.value("accumulate", phase.accumulate);
  phase.precision = spec.precision;
  if (p.contains("precision"))
    phase.precision = precisionOf(p["precision"].get<std::string>());
  return Status::ok();
}

Status parseSample(const json &s, Spec &spec) {
  GANC_TRY(need(s.is_object(), "'sample' must be an object"));
  GANC_TRY(checkObject(s, "sample", "'sample': "));
  GANC_TRY(needVersion(spec.version, s, "sample", "'sample': "));
  SampleSpec sample;
  const bool method = s.contains("method");
  GANC_TRY(need(method != (s.contains("submodule") || s.contains("noise_shape")),
                "'sample' needs 'submodule' and 'noise_shape' (a generator on noise) or "
                "'method' and 'inputs' (a method of the GAN), not both"));
  sample.train = s.value("mode", defaultOf<std::string>("sample", "mode")) == "train";
  if (method) {
    sample.method = s.value("method", sample.method);
    GANC_TRY(need(s.contains("inputs") && s["inputs"].is_array(),
                  "'sample': 'method' needs 'inputs', the method's arguments in order"));
    for (const json &in : s["inputs"]) {
      InputSpec input;
      GANC_TRY(parseInput(in, spec, false, "'sample'", input));
      GANC_TRY(need(input.source != InputSource::Output && input.source != InputSource::Controller,
                    "'sample': input '" + input.name +
                        "': the grid's inputs are data, labels, normal, uniform or categorical"));
      sample.inputs.push_back(input);
    }
    spec.sample = sample;
    return Status::ok();
  }
  GANC_TRY(need(s.contains("submodule") && s.contains("noise_shape"),
                "'sample' needs 'submodule' and 'noise_shape'"));
  sample.submodule = s.value("submodule", sample.submodule);
  auto shape = shapeOf(s["noise_shape"], "'sample.noise_shape'");
  if (!shape)
    return shape.status();
  sample.noiseShape = shape.take();
  sample.classes = s.value("classes", sample.classes);
  spec.sample = sample;
  return Status::ok();
}

Status parseControllers(const json &j, Spec &spec) {
  GANC_TRY(need(j.is_object(), "'controllers' must map names to controllers"));
  GANC_TRY(need(spec.version >= 2, "'controllers' is a ganc_spec 2 field; set \"ganc_spec\": 2"));
  for (const auto &[name, c] : j.items()) {
    const std::string where = "controller '" + name + "': ";
    GANC_TRY(need(c.is_object(), where + "must be an object"));
    GANC_TRY(checkObject(c, "controller", where));
    ControllerSpec controller;
    controller.type = c.value("type", controller.type);
    GANC_TRY(need(!(c.contains("phase") && c.contains("phases")),
                  where + "give 'phase' or 'phases', not both"));
    if (c.contains("phases")) {
      GANC_TRY(need(c["phases"].is_array() && !c["phases"].empty() &&
                        std::all_of(c["phases"].begin(), c["phases"].end(),
                                    [](const json &n) { return n.is_string(); }),
                    where + "'phases' must be a list of phase names"));
      controller.phases = c["phases"].get<std::vector<std::string>>();
    } else {
      controller.phases = {c.value("phase", std::string())};
    }
    controller.statistic = c.value("statistic", controller.statistic);
    controller.target = c.value("target", controller.target);
    controller.interval = c.value("interval", controller.interval);
    controller.speedKimg = c.value("speed_kimg", controller.speedKimg);
    controller.initial = c.value("initial", controller.initial);
    for (const std::string &name : controller.phases) {
      const PhaseSpec *phase = spec.findPhase(name);
      GANC_TRY(need(phase && !phase->isSection(),
                    where + "'phase' must name a phase that trains and logs the statistic, got '" +
                        name + "'"));
    }
    GANC_TRY(need(!controller.statistic.empty(), where + "'statistic' must name a value phase '" +
                                                     controller.phases[0] + "' logs"));
    spec.controllers[name] = controller;
  }
  return Status::ok();
}

Status checkControllerInputs(const Spec &spec) {
  for (const PhaseSpec &phase : spec.phases)
    for (const InputSpec &in : phase.inputs)
      GANC_TRY(need(in.source != InputSource::Controller || spec.controllers.count(in.controller),
                    "phase '" + phase.name + "': input '" + in.name + "' reads controller '" +
                        in.controller + "', which 'controllers' does not declare"));
  return Status::ok();
}

Status checkSharedValues(const Spec &spec) {
  std::map<std::string, std::string> takenThrough; // section -> the phase taking its graph
  std::set<std::pair<std::string, std::string>> taken;
  for (size_t i = 0; i < spec.phases.size(); ++i) {
    const PhaseSpec &phase = spec.phases[i];
    const std::string where = "phase '" + phase.name + "'";
    for (const InputSpec &in : phase.inputs) {
      if (in.source != InputSource::Output)
        continue;
      const std::string at =
          where + ": input '" + in.name + "' takes '" + in.producer + "." + in.value + "'";
      auto producer = std::find_if(spec.phases.begin(), spec.phases.begin() + i,
                                   [&](const PhaseSpec &p) { return p.name == in.producer; });
      GANC_TRY(need(producer != spec.phases.begin() + i,
                    at + ", but no phase before it is named '" + in.producer +
                        "' (phases run in the spec's order)"));
      GANC_TRY(need(std::count(producer->outputs.begin(), producer->outputs.end(), in.value) > 0,
                    at + ", which is not one of phase '" + in.producer + "''s 'outputs'"));
      GANC_TRY(need(phase.interval % producer->interval == 0,
                    at + ": it runs every " + std::to_string(phase.interval) + " steps, '" +
                        in.producer + "' every " + std::to_string(producer->interval) +
                        ", so the value is not computed on every step that takes it"));
      GANC_TRY(need(phase.accumulate == producer->accumulate,
                    at +
                        ": micro-batch j takes the producer's micro-batch j, so both need the "
                        "same 'accumulate' (" +
                        std::to_string(phase.accumulate) + " and " +
                        std::to_string(producer->accumulate) + ")"));
      taken.insert({in.producer, in.value});
      if (in.detach)
        continue;
      GANC_TRY(need(producer->isSection(),
                    at + " through its graph, but '" + in.producer +
                        "' trains and has run its backward: take it detached, or compute it in "
                        "a section (a phase without 'updates')"));
      GANC_TRY(need(!phase.isSection(),
                    at + " through its graph: a section has no backward (take it detached)"));
      auto [other, first] = takenThrough.emplace(in.producer, phase.name);
      GANC_TRY(need(first || other->second == phase.name,
                    at + " through its graph, which phase '" + other->second +
                        "' takes through its graph already (one backward per graph)"));
    }
  }
  for (const PhaseSpec &phase : spec.phases) {
    const std::string where = "phase '" + phase.name + "'";
    for (const std::string &output : phase.outputs)
      GANC_TRY(need(taken.count({phase.name, output}) > 0,
                    where + ": output '" + output + "' is taken by no later phase"));
    if (!phase.isSection() && phase.outputs.empty())
      continue;
    GANC_TRY(need(!spec.stages, where + ": values handed between phases ('outputs') are not "
                                        "supported with 'stages' yet"));
    GANC_TRY(need(!phase.isSection() || spec.syncBatchNorm.empty(),
                  where + ": a section (a phase without 'updates') is not supported with "
                          "'sync_batch_norm' yet"));
  }
  return Status::ok();
}

} // namespace ganc::frontend::reading
