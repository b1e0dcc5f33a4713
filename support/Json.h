// JSON text from users' files (specs, dataset.json, profiles) parsed with a nesting limit and
// errors of one short line: nlohmann's parser builds any depth (100,000 levels of `[` crash
// the process when the value is destroyed) and quotes what it read in its messages.
#pragma once

#include "support/Status.h"

#include <nlohmann/json.hpp>

#include <string>

namespace ganc {

/// Deeper than this, a JSON text is refused (ganc's own formats nest at most six levels).
constexpr int kMaxJsonDepth = 64;

/// Parses `text`; an error names `what` (e.g. "ganc.json"), says where (byte offset) and why
/// in at most a short excerpt, and refuses nesting deeper than kMaxJsonDepth.
inline Expected<nlohmann::json> parseJson(const std::string &text, const std::string &what) {
  bool tooDeep = false;
  auto limit = [&tooDeep](int depth, nlohmann::json::parse_event_t, nlohmann::json &) {
    if (depth > kMaxJsonDepth)
      tooDeep = true;
    return !tooDeep; // false discards the value; parsing goes on, shallow
  };
  try {
    nlohmann::json j = nlohmann::json::parse(text, limit);
    if (tooDeep)
      return Status::error(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                           " levels");
    return j;
  } catch (const nlohmann::json::parse_error &e) {
    if (tooDeep)
      return Status::error(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                           " levels");
    std::string why = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error while
    // parsing value - invalid literal; last read: '...'": the reason, without what it read.
    const size_t reason = why.find(": ");
    why = reason == std::string::npos ? why : why.substr(reason + 2);
    const size_t read = why.find("; last read");
    why = why.substr(0, read);
    if (why.size() > 160)
      why = why.substr(0, 157) + "...";
    return Status::error(what + ": not valid JSON (" + why + ")");
  }
}

} // namespace ganc
