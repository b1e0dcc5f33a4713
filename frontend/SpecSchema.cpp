// The spec's schema, from SpecFields.def: known keys with suggestions, version checks, and the
// schema as docs/spec.md and the Python package read it.
#include "frontend/SpecSchema.h"

#include "ir/Module.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

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
#define GANC_SPEC_FIELD(OBJECT, KEY, VERSION, NAME, MEANING, VALUE, RULE)                          \
  SpecField{OBJECT, KEY, VERSION, NAME, MEANING, VALUE, RULE},
#include "frontend/SpecFields.def"
  };
  return fields;
}

const SpecField &specField(const char *object, const char *key) {
  for (const SpecField &f : specFields())
    if (std::string(f.object) == object && std::string(f.key) == key)
      return f;
  std::fprintf(stderr, "ganc: internal error: the spec schema has no '%s.%s'\n", object, key);
  std::abort();
}

namespace {

/// "4096", "0.5", "1e-08": the shortest text that reads back as `v`.
std::string numberText(double v) {
  std::ostringstream out;
  out.precision(15);
  out << v;
  return out.str();
}

std::vector<std::string> namesOf(const ValueRule &rule) {
  std::vector<std::string> names;
  std::string all = rule.names;
  for (size_t begin = 0; !all.empty() && begin <= all.size();) {
    const size_t bar = std::min(all.find('|', begin), all.size());
    names.push_back(all.substr(begin, bar - begin));
    begin = bar + 1;
  }
  return names;
}

} // namespace

std::string boundsText(const ValueRule &rule) {
  const bool low = std::isfinite(rule.low), high = std::isfinite(rule.high);
  if (low && high && rule.kind == ValueKind::Integer && !rule.lowStrict && !rule.highStrict)
    return "from " + numberText(rule.low) + " to " + numberText(rule.high);
  if (low && high)
    return std::string("in ") + (rule.lowStrict ? "(" : "[") + numberText(rule.low) + ", " +
           numberText(rule.high) + (rule.highStrict ? ")" : "]");
  if (low)
    return (rule.lowStrict ? "> " : ">= ") + numberText(rule.low);
  if (high)
    return (rule.highStrict ? "< " : "<= ") + numberText(rule.high);
  return "";
}

std::string ruleText(const ValueRule &rule) {
  const std::string bounds = boundsText(rule);
  const std::string within = bounds.empty() ? "" : " " + bounds;
  switch (rule.kind) {
  case ValueKind::Boolean:
    return "true or false";
  case ValueKind::Integer:
    return "an integer" + within;
  case ValueKind::Number: {
    std::string text = rule.count ? std::to_string(rule.count) + " numbers" : "a number";
    text += within;
    for (const std::string &name : namesOf(rule))
      text += " or \"" + name + "\"";
    return text;
  }
  case ValueKind::Text:
    return "a non-empty string";
  case ValueKind::Choice: {
    const std::vector<std::string> names = namesOf(rule);
    std::string text = names.size() == 1 ? "" : "one of ";
    for (size_t i = 0; i < names.size(); ++i)
      text += (i ? ", " : "") + names[i];
    return text;
  }
  case ValueKind::Structured:
    break;
  }
  return "";
}

bool withinBounds(const ValueRule &rule, double v) {
  if (std::isnan(v) || (rule.kind == ValueKind::Integer && v != std::floor(v)))
    return false;
  const bool lowOk = rule.lowStrict ? v > rule.low : v >= rule.low;
  const bool highOk = rule.highStrict ? v < rule.high : v <= rule.high;
  return lowOk && highOk;
}

bool isNamed(const ValueRule &rule, const std::string &name) {
  const std::vector<std::string> names = namesOf(rule);
  return std::find(names.begin(), names.end(), name) != names.end();
}

namespace {

bool numberWithin(const ValueRule &rule, const json &v) {
  if (rule.kind == ValueKind::Integer ? !v.is_number_integer() : !v.is_number())
    return false;
  return withinBounds(rule, v.get<double>());
}

bool obeys(const ValueRule &rule, const json &v) {
  switch (rule.kind) {
  case ValueKind::Structured:
    return true;
  case ValueKind::Boolean:
    return v.is_boolean();
  case ValueKind::Text:
    return v.is_string() && !v.get<std::string>().empty();
  case ValueKind::Choice:
    return v.is_string() && isNamed(rule, v.get<std::string>());
  case ValueKind::Integer:
  case ValueKind::Number:
    if (v.is_string())
      return isNamed(rule, v.get<std::string>());
    if (rule.count == 0)
      return numberWithin(rule, v);
    return v.is_array() && v.size() == static_cast<size_t>(rule.count) &&
           std::all_of(v.begin(), v.end(), [&](const json &x) { return numberWithin(rule, x); });
  }
  return false;
}

} // namespace

Status checkValue(const json &value, const char *object, const char *key,
                  const std::string &where) {
  const ValueRule &rule = specField(object, key).value;
  if (obeys(rule, value))
    return Status::ok();
  return Status::error(where + "'" + key + "' must be " + ruleText(rule) + ", got " + value.dump());
}

Status checkObject(const json &j, const char *object, const std::string &where) {
  std::vector<std::string> known;
  for (const SpecField &f : specFields())
    if (std::string(f.object) == object)
      known.push_back(f.key);
  GANC_TRY(knownKeys(j, known, where));
  if (!j.is_object())
    return Status::ok();
  for (const auto &item : j.items())
    GANC_TRY(checkValue(item.value(), object, item.key().c_str(), where));
  return Status::ok();
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

namespace {

/// docs/spec.md's rule cell: the value's rule, its default, then the rules involving others.
std::string ruleCell(const SpecField &f) {
  std::string text = ruleText(f.value);
  if (*f.value.fallback)
    text += " (default `" + std::string(f.value.fallback) + "`)";
  if (*f.rule)
    text += (text.empty() ? "" : "; ") + std::string(f.rule);
  return cell(text);
}

nlohmann::ordered_json ruleJson(const ValueRule &rule) {
  static const char *kinds[] = {"structured", "boolean", "integer", "number", "text", "choice"};
  nlohmann::ordered_json j = {{"kind", kinds[static_cast<int>(rule.kind)]},
                              {"text", ruleText(rule)}};
  if (std::isfinite(rule.low))
    j["low"] = rule.low, j["low_strict"] = rule.lowStrict;
  if (std::isfinite(rule.high))
    j["high"] = rule.high, j["high_strict"] = rule.highStrict;
  if (*rule.names)
    j["names"] = namesOf(rule);
  if (rule.count)
    j["count"] = rule.count;
  if (*rule.fallback)
    j["default"] = nlohmann::ordered_json::parse(rule.fallback);
  return j;
}

} // namespace

std::string specFieldsMarkdown() {
  std::string out = "| field | meaning | rule |\n| --- | --- | --- |\n";
  for (const SpecField &f : specFields())
    if (*f.name)
      out += std::string("| `") + f.name + "` | " + (f.version > 1 ? "(v2) " : "") +
             cell(f.meaning) + " | " + ruleCell(f) + " |\n";
  return out;
}

std::string specFieldsJson() {
  nlohmann::ordered_json keys = nlohmann::ordered_json::object();
  nlohmann::ordered_json versions = nlohmann::ordered_json::object();
  nlohmann::ordered_json rules = nlohmann::ordered_json::object();
  for (const SpecField &f : specFields()) {
    keys[f.object].push_back(f.key);
    if (f.version > 1)
      versions[f.object][f.key] = f.version;
    if (f.value.kind != ValueKind::Structured)
      rules[f.object][f.key] = ruleJson(f.value);
  }
  nlohmann::ordered_json j = {{"comment", "generated from frontend/SpecFields.def by `ganc spec "
                                          "--fields-json` (scripts/gen_docs.py); do not edit"},
                              {"keys", keys},
                              {"version", versions},
                              {"rules", rules}};
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
