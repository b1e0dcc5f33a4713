// Sections in the IR: a phase whose backward continues into a section's graph is lowered
// from one graph that runs the section and then the phase's method on its values.
#pragma once

#include "frontend/Archive.h"

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace ganc::frontend {

/// One graph for `phase` (which takes values through their graph): each of its sections
/// called first, then the phase's method on the sections' values, so that the passes see the
/// whole computation its backward runs through (the plan's `through`). Its inputs are
/// `self`, the method's other inputs and each section's (named "<section>_<input>"), which
/// `phase.inputs` is set to.
Expected<std::shared_ptr<torch::jit::Graph>> throughGraph(Archive &archive, PhaseSpec &phase);

/// Replaces `dict[key]` of a dict literal and a constant key by the value stored there (a
/// section's `{"fake": fake}` read by the phase that takes `fake` through its graph), once
/// the graph is inlined. A read it cannot follow is an error naming the key.
Status foldDictReads(torch::jit::Graph &graph);

} // namespace ganc::frontend
