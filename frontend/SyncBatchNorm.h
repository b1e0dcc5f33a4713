// Synchronised batch norm at compile time: the rewrite of a submodule's aten::batch_norm ops
// into ganc::sync_batch_norm (statistics over every rank's batch).
#pragma once

#include "support/Status.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

#include <set>
#include <string>

namespace ganc::frontend {

/// Replaces every aten::batch_norm of `graph` that belongs to a module under one of
/// `submodules` ("generator" covers "generator.main.1") by ganc::sync_batch_norm: by the
/// parameter or buffer its weight or running statistics read, else by the module calls it was
/// inlined from (resolved against `root`, the model). `paths` maps each value of `graph`
/// produced by a GetAttr chain to the attribute path it reads. Adds the submodules that had a
/// batch norm rewritten to `rewritten`.
void rewriteSyncBatchNorm(torch::jit::Graph &graph,
                          const std::map<torch::jit::Value *, std::string> &paths,
                          const torch::jit::Module &root,
                          const std::vector<std::string> &submodules,
                          std::set<std::string> &rewritten);

} // namespace ganc::frontend
