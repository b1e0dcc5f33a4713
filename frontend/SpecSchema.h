// The spec's schema (SpecFields.def): every object's keys, the version that added each, and
// what docs/spec.md says of them.
#pragma once

#include "support/Status.h"

#include <nlohmann/json.hpp>

#include <limits>
#include <string>
#include <vector>

namespace ganc::frontend {

/// What a key's value is, where its rule is a plain value; Structured keys hold lists and
/// objects their readers check.
enum class ValueKind { Structured, Boolean, Integer, Number, Text, Choice };

/// A key's value rule (SpecFields.def's VALUE column): its kind, bounds, names and default.
/// The readers, `ganc train`'s options and the Python package check values by it, so each
/// limit is written once.
struct ValueRule {
  static constexpr double kOpen = std::numeric_limits<double>::infinity();
  ValueKind kind = ValueKind::Structured;
  double low = -kOpen, high = kOpen;
  /// The bound itself is outside (`> low`, `< high`).
  bool lowStrict = false, highStrict = false;
  /// Choice: the names, '|'-separated; Number: a name it may also be ("inf").
  const char *names = "";
  /// The default as JSON text ("1", "\"stop\""); "" where the reader decides it.
  const char *fallback = "";
  /// Number: a list of exactly this many numbers (Adam's betas); 0: one number.
  int count = 0;

  constexpr ValueRule atLeast(double v) const { return bound(v, false, true); }
  constexpr ValueRule above(double v) const { return bound(v, true, true); }
  constexpr ValueRule atMost(double v) const { return bound(v, false, false); }
  constexpr ValueRule below(double v) const { return bound(v, true, false); }
  constexpr ValueRule orName(const char *name) const {
    ValueRule r = *this;
    r.names = name;
    return r;
  }
  constexpr ValueRule byDefault(const char *json) const {
    ValueRule r = *this;
    r.fallback = json;
    return r;
  }

private:
  constexpr ValueRule bound(double v, bool strict, bool isLow) const {
    ValueRule r = *this;
    (isLow ? r.low : r.high) = v;
    (isLow ? r.lowStrict : r.highStrict) = strict;
    return r;
  }
};

constexpr ValueRule structured() { return {}; }
constexpr ValueRule boolean() { return {ValueKind::Boolean}; }
constexpr ValueRule integer() { return {ValueKind::Integer}; }
constexpr ValueRule number() { return {ValueKind::Number}; }
constexpr ValueRule numbers(int count) {
  ValueRule r{ValueKind::Number};
  r.count = count;
  return r;
}
constexpr ValueRule text() { return {ValueKind::Text}; }
constexpr ValueRule oneOf(const char *names) { return ValueRule{ValueKind::Choice}.orName(names); }

/// One row of SpecFields.def.
struct SpecField {
  const char *object;
  const char *key;
  int version;
  /// docs/spec.md's name of it ("phases[].interval"); "" when its object's row describes it.
  const char *name;
  const char *meaning;
  ValueRule value;
  /// The rules that involve other fields (prose).
  const char *rule;
};

/// Every row, in docs/spec.md's order.
const std::vector<SpecField> &specFields();

/// The row of `object`'s `key`; a key the schema lacks is a programming error (it aborts).
const SpecField &specField(const char *object, const char *key);

/// The rule as the messages and docs say it: "an integer from 1 to 4096", "a number in (0, 1)",
/// "`stop` or `skip`".
std::string ruleText(const ValueRule &rule);
/// Its bounds alone: "from 1 to 4096", ">= 1", "in (0, 1)"; "" when unbounded.
std::string boundsText(const ValueRule &rule);
/// Whether the number `v` is within the rule's bounds (and whole, for an integer rule).
bool withinBounds(const ValueRule &rule, double v);
/// Whether the name `name` is one of the rule's names.
bool isNamed(const ValueRule &rule, const std::string &name);

/// `value` against the rule of `object`'s `key`: "'accumulate' must be an integer from 1 to
/// 4096, got 0" after `where`.
Status checkValue(const nlohmann::json &value, const char *object, const char *key,
                  const std::string &where);

/// The JSON object `j` as the schema has `object`: every key one of its keys (a misspelled one
/// is an error with a suggestion, "did you mean 'interval'?", never silently ignored) and every
/// value within its rule. `where` names the object ("phase 'd': ").
Status checkObject(const nlohmann::json &j, const char *object, const std::string &where);

/// The default of `object`'s `key` (its row's byDefault), as a T.
template <typename T> T defaultOf(const char *object, const char *key) {
  return nlohmann::json::parse(specField(object, key).value.fallback).get<T>();
}

/// The same against a list of keys (an lr_schedule's, which depend on its type).
Status knownKeys(const nlohmann::json &j, const std::vector<std::string> &known,
                 const std::string &where);

/// A key of `object` that a later schema version added, in a spec of an earlier `version`,
/// is refused: the writer must say which schema it means.
Status needVersion(int version, const nlohmann::json &j, const char *object,
                   const std::string &where);

/// docs/spec.md's field table.
std::string specFieldsMarkdown();

/// {"keys": {object: [key, ...]}, "version": {object: {key: version}}, "rules": {object: {key:
/// rule}}}: what the Python validator reads (python/ganc/spec_fields.json).
std::string specFieldsJson();

/// The spec text a plan carries (ir::Module::spec): `json` less the keys the plan holds as
/// phase and module attributes (each phase's interval, accumulate, precision and loss_scaler;
/// the model-wide precision, loss_scalers, zero and every optimizer's clip_grad_norm), so each
/// fact is written once in the plan. Sections, which are no phases of the plan, keep theirs
/// (their precision resolved). Compact JSON.
std::string planSpecText(const std::string &json);

} // namespace ganc::frontend
