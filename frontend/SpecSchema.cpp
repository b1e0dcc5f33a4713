// The spec's schema, from SpecFields.def: known keys with suggestions, version checks, and the
// schema as docs/spec.md and the Python package read it.
#include "frontend/SpecSchema.h"

#include <algorithm>

namespace ganc::frontend {

using json = nlohmann::json;

namespace {

/// Levenshtein distance, for "did you mean" suggestions.
size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string cell(std::string text) {
  for (size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n'))
    text[at] = ' ';
  return text;
}

} // namespace

const std::vector<SpecField> &specFields() {
  static const std::vector<SpecField> fields = {
#define GANC_SPEC_FIELD(OBJECT, KEY, VERSION, NAME, MEANING, RULE)                                 \
  SpecField{OBJECT, KEY, VERSION, NAME, MEANING, RULE},
#include "frontend/SpecFields.def"
  };
  return fields;
}

Status knownKeys(const nlohmann::json &j, const char *object, const std::string &where) {
  std::vector<std::string> known;
  for (const SpecField &f : specFields())
    if (std::string(f.object) == object)
      known.push_back(f.key);
  return knownKeys(j, known, where);
}

Status knownKeys(const nlohmann::json &j, const std::vector<std::string> &known,
                 const std::string &where) {
  if (!j.is_object())
    return Status::ok(); // the caller's own check says what it must be
  for (const auto &item : j.items()) {
    const std::string &key = item.key();
    std::string best;
    size_t bestDistance = 3; // suggest only close names
    bool found = false;
    for (const std::string &k : known) {
      if (key == k) {
        found = true;
        break;
      }
      const size_t d = editDistance(key, k);
      if (d < bestDistance) {
        bestDistance = d;
        best = k;
      }
    }
    if (!found)
      return Status::error(where + "unknown key '" + key + "'" +
                           (best.empty() ? std::string() : " (did you mean '" + best + "'?)"));
  }
  return Status::ok();
}

Status needVersion(int version, const nlohmann::json &j, const char *object,
                   const std::string &where) {
  if (!j.is_object())
    return Status::ok();
  for (const SpecField &f : specFields())
    if (std::string(f.object) == object && f.version > version && j.contains(f.key))
      return Status::error(where + "'" + f.key + "' is a ganc_spec " + std::to_string(f.version) +
                           " field; set \"ganc_spec\": " + std::to_string(f.version));
  return Status::ok();
}

std::string specFieldsMarkdown() {
  std::string out = "| field | meaning | rule |\n| --- | --- | --- |\n";
  for (const SpecField &f : specFields())
    if (*f.name)
      out += std::string("| `") + f.name + "` | " + (f.version > 1 ? "(v2) " : "") +
             cell(f.meaning) + " | " + cell(f.rule) + " |\n";
  return out;
}

std::string specFieldsJson() {
  nlohmann::ordered_json keys = nlohmann::ordered_json::object();
  nlohmann::ordered_json versions = nlohmann::ordered_json::object();
  for (const SpecField &f : specFields()) {
    keys[f.object].push_back(f.key);
    if (f.version > 1)
      versions[f.object][f.key] = f.version;
  }
  nlohmann::ordered_json j = {{"comment", "generated from frontend/SpecFields.def by `ganc spec "
                                          "--fields-json` (scripts/gen_docs.py); do not edit"},
                              {"keys", keys},
                              {"version", versions}};
  return j.dump(1) + "\n";
}

std::string planSpecText(const std::string &text) {
  json spec = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!spec.is_object())
    return text; // parseSpec has refused it already
  const json precision = spec.value("precision", json("float32"));
  for (const char *key : {"precision", "loss_scalers", "zero"})
    spec.erase(key);
  if (spec.contains("phases") && spec["phases"].is_array())
    for (json &phase : spec["phases"]) {
      if (!phase.is_object())
        continue;
      // A section is no phase of the plan: the spec keeps its facts, its precision resolved.
      if (phase.value("updates", json::array()).empty()) {
        if (!phase.contains("precision"))
          phase["precision"] = precision;
        continue;
      }
      for (const char *key : {"interval", "accumulate", "precision", "loss_scaler"})
        phase.erase(key);
    }
  if (spec.contains("optimizers") && spec["optimizers"].is_object())
    for (auto &entry : spec["optimizers"].items())
      if (entry.value().is_object())
        entry.value().erase("clip_grad_norm");
  return spec.dump();
}

} // namespace ganc::frontend
