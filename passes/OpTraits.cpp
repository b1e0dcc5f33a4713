// The op-traits table (OpTraits.def) as lookups.
#include "passes/OpTraits.h"

#include <algorithm>
#include <map>
#include <set>

namespace ganc::passes {

namespace {

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Per operand the gradient flows through, the operands backward reads.
using Rule = std::vector<std::vector<size_t>>;

} // namespace

bool isNonDifferentiable(const std::string &op) {
  static const std::set<std::string> ops = {
#define GANC_OP_NONDIFF(name) name,
#include "passes/OpTraits.def"
  };
  return ops.count(op) > 0;
}

bool isView(const std::string &op) {
  static const std::set<std::string> ops = {
#define GANC_OP_VIEW(name) name,
#include "passes/OpTraits.def"
  };
  return ops.count(op) > 0;
}

bool writesContainer(const std::string &op) {
  static const std::set<std::string> ops = {
#define GANC_OP_CONTAINER_WRITE(name) name,
#include "passes/OpTraits.def"
  };
  return ops.count(op) > 0;
}

bool isInPlace(const std::string &op) {
  return op.rfind("aten::", 0) == 0 && endsWith(op, "_") && !endsWith(op, "__");
}

const std::vector<size_t> *backwardReads(const std::string &op, size_t through) {
  static const std::vector<size_t> none;
  static const std::map<std::string, Rule> rules = {
#define GANC_OP_BACKWARD(name, ...) {name, Rule{__VA_ARGS__}},
#include "passes/OpTraits.def"
  };
  auto it = rules.find(op);
  // An in-place variant's backward is its out-of-place op's (derivatives.yaml gives one
  // formula for both): aten::add_ reads what aten::add reads.
  if (it == rules.end() && isInPlace(op))
    it = rules.find(op.substr(0, op.size() - 1));
  if (it == rules.end())
    return nullptr;
  return through < it->second.size() ? &it->second[through] : &none;
}

const std::vector<size_t> *backwardReads(const ir::Op &op, size_t through,
                                         std::vector<size_t> &storage) {
  const std::string prefix = ir::kBackwardReadsPrefix;
  const bool measured = std::any_of(op.attributes.begin(), op.attributes.end(), [&](const auto &a) {
    return a.first.compare(0, prefix.size(), prefix) == 0;
  });
  if (!measured)
    return backwardReads(op.name, through);
  storage.clear();
  const ir::Attribute *row = op.attribute(prefix + std::to_string(through));
  if (row != nullptr && std::holds_alternative<std::vector<int64_t>>(*row))
    for (int64_t i : std::get<std::vector<int64_t>>(*row))
      storage.push_back(static_cast<size_t>(i));
  return &storage;
}

const char *captureUnsafeReason(const std::string &op) {
  static const std::map<std::string, const char *> reasons = {
#define GANC_OP_CAPTURE_UNSAFE(name, why) {name, why},
#include "passes/OpTraits.def"
  };
  auto it = reasons.find(op);
  return it == reasons.end() ? nullptr : it->second;
}

} // namespace ganc::passes
