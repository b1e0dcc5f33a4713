// Reads and validates ganc.json.
#include "frontend/Spec.h"
#include "frontend/SpecReading.h"
#include "frontend/SpecSchema.h"

#include "ir/Module.h"
#include "support/Json.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <limits>
#include <set>
#include <type_traits>

namespace ganc::frontend {

namespace {

constexpr std::pair<InputSource, const char *> kSources[] = {
    {InputSource::Data, "data"},
    {InputSource::Labels, "labels"},
    {InputSource::Normal, "normal"},
    {InputSource::Uniform, "uniform"},
    {InputSource::Categorical, "categorical"},
    {InputSource::Fade, "fade"},
    {InputSource::Output, "output"},
    {InputSource::Controller, "controller"},
};

constexpr std::pair<Precision, const char *> kPrecisions[] = {
    {Precision::Float32, "float32"},
    {Precision::BFloat16, "bfloat16"},
    {Precision::Float16, "float16"},
};

} // namespace

const char *precisionName(Precision precision) {
  for (const auto &[p, name] : kPrecisions)
    if (p == precision)
      return name;
  return "?";
}

Precision precisionOf(const std::string &name) {
  for (const auto &[p, spelled] : kPrecisions)
    if (name == spelled)
      return p;
  return Precision::Float32;
}

const char *inputSourceName(InputSource source) {
  for (const auto &[s, name] : kSources)
    if (s == source)
      return name;
  return "?";
}

std::optional<InputSource> parseInputSource(const std::string &name) {
  for (const auto &[s, n] : kSources)
    if (name == n)
      return s;
  return std::nullopt;
}

using nlohmann::json;

namespace reading {

Status need(bool condition, const std::string &message) {
  return condition ? Status::ok() : Status::error(message);
}

Expected<std::vector<int64_t>> shapeOf(const json &j, const std::string &where) {
  if (!j.is_array())
    return Status::error(where + " must be a list of integers");
  std::vector<int64_t> shape;
  for (const json &d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0)
      return Status::error(where + " must be a list of positive integers");
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

/// A path in `updates` or `params`: dotted attribute names ("discriminator.head").
bool isPath(const std::string &path) {
  if (path.empty() || path.front() == '.' || path.back() == '.' ||
      path.find("..") != std::string::npos)
    return false;
  return std::all_of(path.begin(), path.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  });
}

} // namespace reading

using namespace reading;

namespace {

/// 'loss_scalers': {"name": {init_scale, growth_factor, backoff_factor, growth_interval}}.
Status parseLossScalers(const json &j, Spec &spec) {
  GANC_TRY(need(j.is_object(), "'loss_scalers' must map scaler names to their settings"));
  for (const auto &[name, v] : j.items()) {
    std::string where = "loss scaler '" + name + "'";
    GANC_TRY(need(!name.empty() && name.find_first_of("\" \t\n") == std::string::npos,
                  where + ": a name cannot be empty or hold quotes or spaces"));
    GANC_TRY(need(v.is_object(), where + " must be an object"));
    GANC_TRY(checkObject(v, "scaler", where + ": "));
    LossScalerSpec scaler;
    scaler.initScale = v.value("init_scale", scaler.initScale);
    scaler.growthFactor = v.value("growth_factor", scaler.growthFactor);
    scaler.backoffFactor = v.value("backoff_factor", scaler.backoffFactor);
    scaler.growthInterval = v.value("growth_interval", scaler.growthInterval);
    spec.lossScalers[name] = scaler;
  }
  return Status::ok();
}

Status parseStages(const json &j, Spec &spec) {
  GANC_TRY(checkObject(j, "stages", "'stages': "));
  GANC_TRY(need(j.is_object() && j.contains("attributes") && j["attributes"].is_array() &&
                    !j["attributes"].empty(),
                "'stages' needs 'attributes': the int module attributes that select the stage "
                "(e.g. [\"generator.stage\"])"));
  StagesSpec stages;
  for (const json &a : j["attributes"]) {
    GANC_TRY(need(a.is_string() && !a.get<std::string>().empty(),
                  "'stages.attributes' must hold attribute paths"));
    stages.attributes.push_back(a.get<std::string>());
  }
  GANC_TRY(need(j.contains("list") && j["list"].is_array() && !j["list"].empty(),
                "'stages.list' must be a non-empty list of stages"));
  std::set<std::string> names;
  for (size_t i = 0; i < j["list"].size(); ++i) {
    const json &s = j["list"][i];
    bool last = i + 1 == j["list"].size();
    GANC_TRY(need(s.is_object() && s.contains("name"), "every stage needs a 'name'"));
    GANC_TRY(checkValue(s["name"], "stage", "name", "stage: "));
    StageSpec stage;
    stage.name = s["name"].get<std::string>();
    std::string where = "stage '" + stage.name + "'";
    GANC_TRY(checkObject(s, "stage", where + ": "));
    GANC_TRY(need(names.insert(stage.name).second, where + " is declared twice"));
    GANC_TRY(need(stage.name.find_first_of("@\" \t\n") == std::string::npos,
                  where + ": a stage name cannot hold '@', quotes or spaces"));
    GANC_TRY(need(last || s.contains("steps"),
                  where + " needs 'steps' (only the last stage may omit it; it runs to the end)"));
    stage.steps = last ? 0 : s["steps"].get<int64_t>();
    stage.fadeSteps = s.value("fade_steps", stage.fadeSteps);
    for (const json &g : s.value("grows", json::array())) {
      GANC_TRY(need(g.is_string() && !g.get<std::string>().empty(),
                    where + ": 'grows' must hold submodule paths"));
      stage.grows.push_back(g.get<std::string>());
    }
    stages.list.push_back(stage);
  }
  spec.stages = stages;
  return Status::ok();
}

/// The EMA copy ('ema'), which no phase may train.
Status parseEma(const json &e, Spec &spec) {
  GANC_TRY(need(e.is_object() && e.contains("submodule") && e.contains("copy"),
                "'ema' needs 'submodule' (the trained one) and 'copy' (its average)"));
  GANC_TRY(checkObject(e, "ema", "'ema': "));
  GANC_TRY(needVersion(spec.version, e, "ema", "'ema': "));
  EmaSpec ema;
  ema.submodule = e["submodule"].get<std::string>();
  ema.copy = e["copy"].get<std::string>();
  ema.halfLifeImages = e.value("half_life_images", ema.halfLifeImages);
  ema.beta = e.value("beta", ema.beta);
  ema.rampup = e.value("rampup", ema.rampup);
  GANC_TRY(need(ema.rampup == 0 || ema.halfLifeImages > 0,
                "'ema': rampup ramps half_life_images up: give one"));
  for (const PhaseSpec &p : spec.phases)
    for (const std::string &u : p.updates)
      GANC_TRY(need(!ir::isWithin(u, ema.copy) && !ir::isWithin(ema.copy, u),
                    "'ema': phase '" + p.name + "' trains the average '" + ema.copy +
                        "'; it must only be averaged"));
  spec.ema = ema;
  return Status::ok();
}

/// The model-wide training-step fields (version 2): precision, loss_scalers, sync_batch_norm,
/// non_finite, zero.
Status parseModelWideTrainingStep(const json &j, Spec &spec) {
  GANC_TRY(needVersion(spec.version, j, "spec", ""));
  spec.zero = j.value("zero", spec.zero);
  spec.nonFinite = j.value("non_finite", spec.nonFinite);
  if (j.contains("sync_batch_norm")) {
    GANC_TRY(need(j["sync_batch_norm"].is_array(),
                  "'sync_batch_norm' must list submodules (\"discriminator\")"));
    for (const json &sub : j["sync_batch_norm"]) {
      GANC_TRY(need(sub.is_string() && !sub.get<std::string>().empty(),
                    "'sync_batch_norm' must list submodule names"));
      spec.syncBatchNorm.push_back(sub.get<std::string>());
    }
  }
  if (j.contains("loss_scalers"))
    GANC_TRY(parseLossScalers(j["loss_scalers"], spec));
  if (j.contains("precision"))
    spec.precision = precisionOf(j["precision"].get<std::string>());
  return Status::ok();
}

/// "[3, 16, 16]".
std::string shapeText(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

/// `data.fields`: each field's shape and offset, and the packed sample shape.
Status parseFields(const json &fields, Spec &spec) {
  GANC_TRY(need(fields.is_array() && !fields.empty(),
                "'data.fields' must be a non-empty list of {\"name\": ..., \"shape\": [...]}"));
  int64_t channels = 0;
  for (const json &f : fields) {
    GANC_TRY(
        need(f.is_object() && f.contains("name") && f["name"].is_string() &&
                 !f["name"].get<std::string>().empty() && f.contains("shape") && f.size() == 2,
             "'data.fields' holds {\"name\": ..., \"shape\": [...]} objects, got " + f.dump()));
    DataField field{f["name"].get<std::string>(), {}, channels};
    const std::string at = "'data.fields': field '" + field.name + "'";
    GANC_TRY(need(field.name != "labels",
                  at + ": 'labels' is the labels' key in a data file; name the field otherwise"));
    GANC_TRY(need(spec.dataField(field.name) == nullptr, at + " is declared twice"));
    auto shape = shapeOf(f["shape"], at + " shape");
    if (!shape)
      return shape.status();
    field.shape = shape.take();
    GANC_TRY(need(!field.shape.empty(), at + ": its shape needs at least one dimension"));
    if (!spec.dataFields.empty()) {
      const DataField &first = spec.dataFields.front();
      GANC_TRY(need(std::equal(field.shape.begin() + 1, field.shape.end(), first.shape.begin() + 1,
                               first.shape.end()),
                    at + " has shape " + shapeText(field.shape) + " and field '" + first.name +
                        "' " + shapeText(first.shape) +
                        ": fields are kept side by side in their first (channel) dimension, so "
                        "the others must match"));
    }
    channels += field.shape[0];
    spec.dataFields.push_back(field);
  }
  spec.dataShape = spec.dataFields.front().shape;
  spec.dataShape[0] = channels;
  return Status::ok();
}

/// `data`: one sample's shape or its fields, the labels' classes, mirroring, the layout.
Status parseData(const json &j, Spec &spec) {
  GANC_TRY(need(j.contains("data") && j["data"].is_object() &&
                    (j["data"].contains("shape") || j["data"].contains("fields")),
                "missing 'data': {\"shape\": [...]}"));
  const json &d = j["data"];
  GANC_TRY(checkObject(d, "data", "'data': "));
  GANC_TRY(needVersion(spec.version, d, "data", "'data': "));
  GANC_TRY(need(!(d.contains("shape") && d.contains("fields")),
                "'data' has 'shape' and 'fields': a sample is one tensor (shape) or named parts "
                "(fields), not both"));
  if (d.contains("fields")) {
    GANC_TRY(parseFields(d["fields"], spec));
  } else {
    auto dataShape = shapeOf(d["shape"], "'data.shape'");
    if (!dataShape)
      return dataShape.status();
    spec.dataShape = dataShape.take();
  }
  spec.dataClasses = d.value("classes", spec.dataClasses);
  spec.dataXflip = d.value("xflip", spec.dataXflip);
  GANC_TRY(need(!spec.dataXflip || spec.dataShape.size() == 3,
                "'data.xflip' mirrors images: it needs a [C, H, W] data shape"));
  spec.dataLayout = d.value("layout", spec.dataLayout);
  if (!spec.dataLayout.empty()) {
    const auto &fields = spec.dataFields;
    GANC_TRY(need(fields.size() >= 2 && std::all_of(fields.begin(), fields.end(),
                                                    [&](const DataField &f) {
                                                      return f.shape.size() == 3 &&
                                                             f.shape == fields[0].shape;
                                                    }),
                  "'data.layout' side_by_side splits an image into its fields: it needs two or "
                  "more 'data.fields' of one [C, H, W] shape"));
  }
  return Status::ok();
}

Status parseInto(const json &j, Spec &spec) {
  GANC_TRY(need(j.is_object(), "must be a JSON object"));
  GANC_TRY(need(j.contains("ganc_spec"), "missing 'ganc_spec' (the schema version)"));
  GANC_TRY(checkObject(j, "spec", ""));
  GANC_TRY(need(j["ganc_spec"].is_number_integer() && j["ganc_spec"].get<int64_t>() >= 1 &&
                    j["ganc_spec"].get<int64_t>() <= kSpecVersion,
                "'ganc_spec' is " + j["ganc_spec"].dump() + ", this ganc reads versions 1 to " +
                    std::to_string(kSpecVersion)));
  spec.version = j["ganc_spec"].get<int>();
  GANC_TRY(parseModelWideTrainingStep(j, spec));
  GANC_TRY(need(j.contains("name"), "missing 'name' (the model's name)"));
  spec.name = j["name"].get<std::string>();
  GANC_TRY(need(j.contains("batch_size"), "missing 'batch_size' (samples per rank per step)"));
  spec.batchSize = j["batch_size"].get<int64_t>();
  GANC_TRY(parseData(j, spec));
  static const std::map<std::string, InputDtype> kDtypes = {{"float32", InputDtype::Float32},
                                                            {"float64", InputDtype::Float64},
                                                            {"bfloat16", InputDtype::BFloat16},
                                                            {"float16", InputDtype::Float16}};
  spec.inputDtype = kDtypes.at(j.value("dtype", defaultOf<std::string>("spec", "dtype")));
  GANC_TRY(need(j.contains("phases") && j["phases"].is_array() && !j["phases"].empty(),
                "'phases' must be a non-empty list"));
  std::set<std::string> names;
  for (const json &p : j["phases"]) {
    PhaseSpec phase;
    GANC_TRY(parsePhase(p, spec, j.contains("stages"), phase));
    GANC_TRY(need(names.insert(phase.name).second, "phase '" + phase.name + "' is declared twice"));
    spec.phases.push_back(phase);
  }
  for (const auto &[name, scaler] : spec.lossScalers)
    GANC_TRY(need(std::any_of(spec.phases.begin(), spec.phases.end(),
                              [&](const PhaseSpec &p) { return p.lossScaler == name; }),
                  "loss scaler '" + name +
                      "' is used by no phase (name it in a phase's 'loss_scaler', or remove it)"));
  GANC_TRY(parseOptimizers(j.value("optimizers", json::object()), spec));
  spec.buffers = j.value("buffers", spec.buffers);
  if (j.contains("ema"))
    GANC_TRY(parseEma(j["ema"], spec));
  if (j.contains("stages"))
    GANC_TRY(parseStages(j["stages"], spec));
  if (j.contains("sample"))
    GANC_TRY(parseSample(j["sample"], spec));
  if (j.contains("controllers"))
    GANC_TRY(parseControllers(j["controllers"], spec));
  GANC_TRY(checkControllerInputs(spec));
  return checkSharedValues(spec);
}

} // namespace

const PhaseSpec *Spec::findPhase(const std::string &name) const {
  for (const PhaseSpec &p : phases)
    if (p.name == name)
      return &p;
  return nullptr;
}

std::vector<std::string> PhaseSpec::throughSections() const {
  std::vector<std::string> sections;
  for (const InputSpec &in : inputs)
    if (in.source == InputSource::Output && !in.detach &&
        std::find(sections.begin(), sections.end(), in.producer) == sections.end())
      sections.push_back(in.producer);
  return sections;
}

std::vector<std::string> Spec::updatedPaths() const {
  std::set<std::string> all;
  for (const PhaseSpec &p : phases)
    all.insert(p.updates.begin(), p.updates.end());
  return {all.begin(), all.end()};
}

std::pair<size_t, int64_t> StagesSpec::at(int64_t step) const {
  int64_t begin = 0;
  for (size_t i = 0; i + 1 < list.size(); ++i) {
    if (step < begin + list[i].steps)
      return {i, begin};
    begin += list[i].steps;
  }
  return {list.size() - 1, begin};
}

double StagesSpec::fade(int64_t step) const {
  auto [index, begin] = at(step);
  int64_t fadeSteps = list[index].fadeSteps;
  if (fadeSteps == 0)
    return 1.0;
  return std::min(1.0, static_cast<double>(step - begin) / static_cast<double>(fadeSteps));
}

Expected<Spec> parseSpec(const std::string &text) {
  Spec spec;
  spec.text = text;
  auto parsed = parseJson(text, "ganc.json");
  if (!parsed)
    return parsed.status();
  try {
    GANC_TRY(parseInto(*parsed, spec).withContext("ganc.json"));
  } catch (const json::exception &e) {
    return Status::error(std::string("ganc.json: ") + e.what());
  }
  return spec;
}

} // namespace ganc::frontend
