// The rewrite of a submodule's aten::batch_norm ops into ganc::sync_batch_norm (the op, with
// its collectives, is in ops/: ops/SyncBatchNorm.cpp).
#include "frontend/SyncBatchNorm.h"

#include <functional>
#include <optional>

namespace ganc::frontend {

namespace {

/// The descendant of `from` that a call in an inlined call chain entered: the one with the
/// call's attribute name and class. A module iterated in a container (ModuleList, ModuleDict)
/// or indexed in one is called without a call to the container, so it can be deeper than a
/// child. Empty unless exactly one descendant fits.
std::optional<torch::jit::NameModule> calledModule(const torch::jit::Module &from,
                                                   const torch::jit::ModuleInstanceInfo &call) {
  std::optional<torch::jit::NameModule> found;
  for (const torch::jit::NameModule &sub : from.named_modules()) {
    const size_t dot = sub.name.rfind('.');
    const std::string last = dot == std::string::npos ? sub.name : sub.name.substr(dot + 1);
    if (sub.name.empty() || last != call.instance_name() || !call.class_type() ||
        sub.value.type()->name() != call.class_type()->name())
      continue;
    if (found)
      return std::nullopt;
    found = sub;
  }
  return found;
}

/// The path of the module an aten::batch_norm node belongs to, with a trailing '.'
/// ("generator.main.1."): the module of the attribute its weight, running mean or running
/// variance reads (a layer with affine=False has no weight), else the chain of module calls it
/// was inlined from, resolved against `root` (a layer with neither weight nor running
/// statistics); "" when unknown.
std::string ownerPath(torch::jit::Node *node,
                      const std::map<torch::jit::Value *, std::string> &paths,
                      const torch::jit::Module &root) {
  // aten::batch_norm(input, weight, bias, running_mean, running_var, ...).
  for (size_t input : {1, 3, 4}) {
    auto path = paths.find(node->inputs()[input]);
    if (path != paths.end())
      return path->second.substr(0, path->second.rfind('.') + 1);
  }
  std::optional<torch::jit::InlinedCallStackPtr> calls = node->callstack();
  if (!calls)
    return "";
  std::string owner;
  torch::jit::Module module = root;
  for (const torch::jit::InlinedCallStackEntry &call : (*calls)->vec()) {
    const std::optional<torch::jit::ModuleInstanceInfo> &entered = std::get<2>(call);
    if (!entered || entered->instance_name() == "SELF")
      continue; // a function, or another method of the same module
    std::optional<torch::jit::NameModule> sub = calledModule(module, *entered);
    if (!sub)
      return "";
    owner += sub->name + ".";
    module = sub->value;
  }
  return owner;
}

} // namespace

void rewriteSyncBatchNorm(torch::jit::Graph &graph,
                          const std::map<torch::jit::Value *, std::string> &paths,
                          const torch::jit::Module &root,
                          const std::vector<std::string> &submodules,
                          std::set<std::string> &rewritten) {
  static const c10::Symbol kSync = c10::Symbol::fromQualString("ganc::sync_batch_norm");
  std::vector<torch::jit::Node *> found;
  std::function<void(torch::jit::Block *)> visit = [&](torch::jit::Block *block) {
    for (torch::jit::Node *node : block->nodes()) {
      if (node->kind() == c10::aten::batch_norm)
        found.push_back(node);
      for (torch::jit::Block *b : node->blocks())
        visit(b);
    }
  };
  visit(graph.block());
  for (torch::jit::Node *node : found) {
    const std::string owner = ownerPath(node, paths, root);
    if (owner.empty())
      continue;
    for (const std::string &sub : submodules) {
      if (owner.compare(0, sub.size() + 1, sub + ".") != 0)
        continue;
      torch::jit::WithInsertPoint guard(node);
      // aten::batch_norm(input, weight, bias, mean, var, training, momentum, eps, cudnn).
      std::vector<torch::jit::Value *> inputs(node->inputs().begin(), node->inputs().end() - 1);
      torch::jit::Node *sync = graph.insertNode(graph.create(kSync, inputs, 1));
      sync->output()->setType(node->output()->type());
      node->output()->replaceAllUsesWith(sync->output());
      node->destroy();
      rewritten.insert(sub);
      break;
    }
  }
}

} // namespace ganc::frontend
