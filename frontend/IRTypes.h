// TorchScript's types and node attributes in the IR's terms, for lowering.
#pragma once

#include "ir/Module.h"

#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <utility>
#include <vector>

namespace ganc::frontend {

/// The IR type of a TorchScript type: a tensor with its dtype and, where known, sizes; a
/// list, optional or tuple of the types inside; a scalar or object by name ("any" else).
ir::Type convert(const c10::TypePtr &type);

/// A node's attributes as the IR keeps them (a tensor attribute by the word "tensor").
std::vector<std::pair<std::string, ir::Attribute>> attributesOf(torch::jit::Node *node);

} // namespace ganc::frontend
