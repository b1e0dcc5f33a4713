// Op semantics the passes share, from the one table in OpTraits.def.
#pragma once

#include "ir/Module.h"

#include <cstddef>
#include <string>
#include <vector>

namespace ganc::passes {

/// Its results never carry a gradient, whatever its operands (detach, *_like factories, size
/// queries).
bool isNonDifferentiable(const std::string &op);

/// Its result shares storage with its first operand.
bool isView(const std::string &op);

/// It writes into its first operand: "aten::add_", but not dunder methods ("aten::__and__").
bool isInPlace(const std::string &op);

/// It puts its other operands into the list or dict that is its first operand
/// (aten::append, aten::_set_item, ...).
bool writesContainer(const std::string &op);

/// The operands the backward formula of `op` reads when the gradient flows through its
/// operand `through` (for y = x * w, the gradient reaching x is computed from w). Null for
/// an op without a row: assume every operand.
const std::vector<size_t> *backwardReads(const std::string &op, size_t through);

/// backwardReads for one op: its measured `backward_reads_<i>` attributes (an operator
/// library's op; see ir::kBackwardReadsPrefix) where it has them, else its name's row.
/// `storage` holds a measured row.
const std::vector<size_t> *backwardReads(const ir::Op &op, size_t through,
                                         std::vector<size_t> &storage);

/// Why a CUDA Graph cannot hold `op` (a host sync, a data-dependent shape), or null.
const char *captureUnsafeReason(const std::string &op);

} // namespace ganc::passes
