// Lowering each phase method of an archive to ganc IR (and, for progressive GANs, the
// stage-specialised TorchScript graphs the runtime runs): the TorchScript door's reader. The
// phases' joint graphs, ATen op lists, are lowered by frontend/JointLowering.h.
#pragma once

#include "frontend/Archive.h"
#include "frontend/Fusion.h"
#include "ir/Module.h"

#include <memory>

namespace ganc::frontend {

/// Lowers every phase of the archive to ganc IR: inlined, `self.training` and other constant
/// module attributes folded, tensor mutation removed, parameters named by qualified path,
/// and shapes/dtypes recorded by running each phase once on example inputs. With `fusion`,
/// each phase records what fusing its graph replaces (the IR keeps the unfused ops: the
/// used-parameter facts are those of the code as written).
Expected<std::unique_ptr<ir::Module>> lowerToIR(Archive &archive, bool fusion = true);

/// The graph the runtime runs for phase `phase` (in stage `stage` of a progressively grown
/// GAN, or -1): its method inlined, every stage attribute replaced by the stage's index and
/// the branches and blocks this makes dead removed, and the batch norms of the spec's
/// `sync_batch_norm` submodules rewritten to ganc::sync_batch_norm. Called with `self` and
/// the phase inputs, so that it executes exactly what the phase's plan was compiled from.
/// With `fusion` non-null, the graph is fused (see Fusion.h) and what was fused is put there.
Expected<std::shared_ptr<torch::jit::Graph>> phaseGraph(Archive &archive, const PhaseSpec &phase,
                                                        int stage, FusionReport *fusion = nullptr);

} // namespace ganc::frontend
