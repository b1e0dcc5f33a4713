// Loading a TorchScript GAN archive with its ganc spec, and its identity.
#pragma once

#include "frontend/Spec.h"
#include "support/torch/JointGraph.h"

#include <torch/script.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ganc::frontend {

/// A loaded archive: its module and its validated spec. Of a TorchScript archive, the module
/// is the archive's code; of ganc's own archive (ganc.export(..., torchscript=False), no
/// TorchScript code: docs/export.md), a module of the same names holding the parameters,
/// buffers and stage attributes, with no methods: its phases run their joint graphs.
struct Archive {
  std::string path;
  torch::jit::Module module;
  /// Whether the archive holds TorchScript code (false: ganc's own archive).
  bool torchscript = true;
  Spec spec;
  /// Fingerprint of code, spec, parameter names/shapes/dtypes (see modelIdentity).
  std::string identity;
  /// The optimizer group of every parameter some phase trains.
  std::map<std::string, std::string> groupOf;
  /// Operators from operator libraries whose backward ganc.export measured (ganc_ops.json's
  /// backward_reads): per operand a gradient flows through, the operands its backward reads.
  std::map<std::string, std::vector<std::vector<int64_t>>> opBackwardReads;
  /// Each phase's joint graph as ganc.export(joint=True) kept it (docs/ir.md "Joint graphs"),
  /// by phase key ("d", or "d@16x16" for a stage's); empty for an archive exported without.
  std::map<std::string, JointGraph> jointGraphs;
  /// The sample grid's call captured as a graph (ganc's own archive, where the spec samples);
  /// its outputs are the images.
  std::optional<JointGraph> sampleGraph;
};

/// Loads `path` and its ganc.json; checks that every phase's method and submodules exist,
/// and that the operators of the operator libraries it was exported with (its
/// ganc_ops.json) are registered. Errors name the file and the culprit; LibTorch exceptions
/// never escape.
/// With `planSpec` (a plan's ir::Module::spec), that spec is bound to the archive's code and
/// checked as its own would be; the identity is still the archive's own.
Expected<Archive> loadArchive(const std::string &path, const std::string &planSpec = "");

/// Loads TORCH_LIBRARY operator libraries (--op-library): each shared library registers its
/// operators, kernels and autograd kernels with the dispatcher when loaded. An error names
/// the library and says why it did not load.
Status loadOpLibraries(const std::vector<std::string> &paths);

/// A 64-bit FNV-1a fingerprint (hex) of the archive's code records, its spec text and its
/// parameter names, shapes and dtypes. A plan records it; the runtime refuses a plan whose
/// fingerprint differs from the archive it is given.
std::string modelIdentity(const std::string &path, const torch::jit::Module &module,
                          const std::string &specText);

/// The object holding the attribute a dotted path names ("generator.blocks.1" -> the
/// generator.blocks object and "1"), or a null object if a step of the path is not a
/// submodule.
std::pair<c10::intrusive_ptr<c10::ivalue::Object>, std::string>
resolvePath(const torch::jit::Module &root, const std::string &path);

} // namespace ganc::frontend
