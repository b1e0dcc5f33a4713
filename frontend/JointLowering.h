// Lowering each phase's joint graph (the op list ganc.export(joint=True) keeps) into the
// phase's `joint` block of the IR, where the passes place its collectives.
#pragma once

#include "frontend/Archive.h"
#include "ir/Module.h"
#include "support/torch/JointGraph.h"

namespace ganc::frontend {

/// `graph` as IR ops appended to `phase.joint`: a port op per input, an op per node (ATen's by
/// the dispatcher's name, `overload` where it is not the default, `view_of` the operand its
/// result shares storage with, as the operator's schema says), an output op per value output.
/// Value names are the op list's.
Status lowerJointGraph(const JointGraph &graph, ir::Phase &phase);

/// The phase of ganc's own archive (no TorchScript code) for `spec` at `stage` (-1: none): its
/// recipe and inputs, with no forward `body` and no loss; its joint graph, which the archive
/// must hold, is lowered by lowerJointGraphs and is the phase's whole code.
std::unique_ptr<ir::Phase> phaseOfJointGraph(const Archive &archive, const PhaseSpec &spec,
                                             int stage);

/// Every phase's joint graph the archive keeps, lowered into its phase of `module`; phases
/// without one keep an empty block.
Status lowerJointGraphs(const Archive &archive, ir::Module &module);

} // namespace ganc::frontend
