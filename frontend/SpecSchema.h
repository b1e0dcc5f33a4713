// The spec's schema (SpecFields.def): every object's keys, the version that added each, and
// what docs/spec.md says of them.
#pragma once

#include "support/Status.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ganc::frontend {

/// One row of SpecFields.def.
struct SpecField {
  const char *object;
  const char *key;
  int version;
  /// docs/spec.md's name of it ("phases[].interval"); "" when its object's row describes it.
  const char *name;
  const char *meaning;
  const char *rule;
};

/// Every row, in docs/spec.md's order.
const std::vector<SpecField> &specFields();

/// Every key of the JSON object `j` must be a key of `object` in the schema: a misspelled one
/// is an error with a suggestion ("did you mean 'interval'?"), never silently ignored.
/// `where` names the object ("phase 'd': ").
Status knownKeys(const nlohmann::json &j, const char *object, const std::string &where);

/// The same against a list of keys (an lr_schedule's, which depend on its type).
Status knownKeys(const nlohmann::json &j, const std::vector<std::string> &known,
                 const std::string &where);

/// A key of `object` that a later schema version added, in a spec of an earlier `version`,
/// is refused: the writer must say which schema it means.
Status needVersion(int version, const nlohmann::json &j, const char *object,
                   const std::string &where);

/// docs/spec.md's field table.
std::string specFieldsMarkdown();

/// {"keys": {object: [key, ...]}, "version": {object: {key: version}}}: what the Python
/// validator reads (python/ganc/spec_fields.json).
std::string specFieldsJson();

/// The spec text a plan carries (ir::Module::spec): `json` less the keys the plan holds as
/// phase and module attributes (each phase's interval, accumulate, precision and loss_scaler;
/// the model-wide precision, loss_scalers, zero and every optimizer's clip_grad_norm), so each
/// fact is written once in the plan. Sections, which are no phases of the plan, keep theirs
/// (their precision resolved). Compact JSON.
std::string planSpecText(const std::string &json);

} // namespace ganc::frontend
