// The ops' schemas, defined in the `ganc` namespace from ops/Ops.def, and what every op
// shares: the table, autocast's rule for the op a fused op replaced.
#include "ops/Ops.h"

#include <torch/library.h>

#include <map>
#include <mutex>
#include <string>

namespace ganc::ops {

TORCH_LIBRARY_FRAGMENT(ganc, m) {
#define GANC_OP(name, schema, autocast, what) m.def(schema);
#include "ops/Ops.def"
#undef GANC_OP
}

const std::vector<OpInfo> &table() {
  static const std::vector<OpInfo> ops = {
#define GANC_OP(name, schema, autocast, what) {#name, schema, autocast, what},
#include "ops/Ops.def"
#undef GANC_OP
  };
  return ops;
}

bool autocastCasts(c10::DispatchKey key, c10::string_view origin) {
  static std::mutex mutex;
  // Per dispatch key, by the replaced op's name (looked up without a copy of it).
  static std::map<c10::DispatchKey, std::map<std::string, bool, std::less<>>> known;
  const std::lock_guard<std::mutex> lock(mutex);
  std::map<std::string, bool, std::less<>> &forKey = known[key];
  auto found = forKey.find(origin);
  if (found == forKey.end()) {
    const size_t dot = origin.find('.');
    const std::string name(origin.substr(0, dot));
    const std::string overload(dot == c10::string_view::npos ? "" : origin.substr(dot + 1));
    const auto op = c10::Dispatcher::singleton().findSchema({name, overload});
    found = forKey.emplace(std::string(origin), op && op->hasKernelForDispatchKey(key)).first;
  }
  return found->second;
}

} // namespace ganc::ops
