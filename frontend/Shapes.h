// Shape probing: runs a phase's graph once on example inputs and records the shape and dtype
// of every tensor it computes (the IR's types come from here, not from TorchScript's
// incomplete type annotations).
#pragma once

#include "frontend/Archive.h"
#include "ir/Module.h"

#include <torch/csrc/jit/ir/ir.h>

#include <map>

namespace ganc::frontend {

/// The dtype of floating phase inputs: the spec's `input_dtype`.
c10::ScalarType inputScalarType(const Spec &spec);

/// A random input of the right shape and dtype for one call of a phase (class ids for
/// labels and categorical inputs), for shape probing and tests.
at::Tensor exampleInput(const Spec &spec, const InputSpec &input, int64_t batch);

/// The values a phase method returned besides its loss, by name: a section's dict, or the
/// dict of `(loss, dict)`; empty for a bare loss. `method` names it in errors.
Expected<c10::impl::GenericDict> returnedValues(const c10::IValue &output,
                                                const std::string &method);

/// What an `output` input takes, on example inputs: the producer phase run once (without
/// recording gradients), its value of that name.
Expected<at::Tensor> exampleOutput(Archive &archive, const InputSpec &input);

/// Runs section `section` once on example inputs and checks what it returns: a dict holding
/// a tensor for each of its outputs, any other key a scalar (logged).
Status checkSection(Archive &archive, const PhaseSpec &section);

/// Runs the phase each controller reads once on example inputs: it must log the controller's
/// statistic as a scalar.
Status checkControllersLogged(Archive &archive);

/// The type of every top-level tensor value of `graph` (the phase's method, called with
/// `self` and the phase inputs) and of its inputs, from one run on example inputs of the
/// spec's batch size. Checks that the method returns one scalar loss tensor (or (loss,
/// dict), the dict holding its outputs and logged scalars). The graph is
/// left as it was.
Expected<std::map<torch::jit::Value *, ir::Type>>
probeShapes(Archive &archive, const PhaseSpec &phase,
            const std::shared_ptr<torch::jit::Graph> &graph);

} // namespace ganc::frontend
