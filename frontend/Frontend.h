// TorchScript archive + ganc spec -> ganc IR. The only place that reads TorchScript graphs.
#pragma once

#include "frontend/Spec.h"
#include "ir/Module.h"

#include <torch/script.h>

#include <memory>
#include <string>

namespace ganc::frontend {

/// A loaded archive: the TorchScript module and its validated spec.
struct Archive {
  std::string path;
  torch::jit::Module module;
  Spec spec;
  /// Fingerprint of code, spec, parameter names/shapes/dtypes (see modelIdentity).
  std::string identity;
};

/// Loads `path` and its ganc.json; checks that every phase's method and submodules exist.
/// Errors name the file and the culprit; LibTorch exceptions never escape.
Expected<Archive> loadArchive(const std::string &path);

/// Lowers every phase of the archive to ganc IR: inlined, `self.training` and other constant
/// module attributes folded, tensor mutation removed, parameters named by qualified path,
/// and shapes/dtypes recorded by running each phase once on example inputs.
Expected<std::unique_ptr<ir::Module>> lowerToIR(Archive &archive);

/// The graph phase `phase` runs in stage `stage` of a progressively grown GAN: its method
/// inlined, every stage attribute replaced by the stage's index, and the branches and blocks
/// that this makes dead removed. Called with `self` and the phase inputs. The runtime runs
/// these, so that it executes exactly what each stage's plan was compiled from.
Expected<std::shared_ptr<torch::jit::Graph>> stageGraph(Archive &archive, const PhaseSpec &phase,
                                                        size_t stage);

/// Sets every stage attribute of the module to `stage`, so that methods the runtime calls
/// unspecialised (the sample grid's forward) see the current stage.
void setStageAttributes(torch::jit::Module &module, const StagesSpec &stages, size_t stage);

/// After the passes ran: every block a stage `grows` is used by that stage's phases and by no
/// earlier stage's. Errors name the stage, the block and the parameter.
Status checkStageGrowth(const Spec &spec, const ir::Module &plan);

/// A 64-bit FNV-1a fingerprint (hex) of the archive's code records, its spec text and its
/// parameter names, shapes and dtypes. A plan records it; the runtime refuses a plan whose
/// fingerprint differs from the archive it is given.
std::string modelIdentity(const std::string &path, const torch::jit::Module &module,
                          const std::string &specText);

/// The torch dtype of a spec dtype name ("float32", ...).
c10::ScalarType inputScalarType(const Spec &spec);

/// A random input of the right shape and dtype for one call of a phase (class ids for
/// labels and categorical inputs), for shape recording and tests.
at::Tensor exampleInput(const Spec &spec, const InputSpec &input, int64_t batch);

/// "f32", "bf16", ... for a torch dtype.
std::string dtypeName(c10::ScalarType type);

} // namespace ganc::frontend
