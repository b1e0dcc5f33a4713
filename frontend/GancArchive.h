// ganc's own archive (ganc.export(..., torchscript=False)): no TorchScript code, read without
// the TorchScript loader. docs/export.md, "Without TorchScript", describes what it holds.
#pragma once

#include "frontend/Archive.h"

#include <string>
#include <vector>

namespace ganc::frontend {

/// Whether a zip archive with these entries is ganc's own (a torch.save container: no
/// TorchScript code records).
bool isGancArchive(const std::vector<std::string> &entries);

/// Reads ganc's own archive from its `bytes`: `archive.module` becomes a module of the
/// archive's parameter, buffer and stage-attribute names with no methods; its joint graphs,
/// sample graph and operator needs go into `archive`; `specText` is its spec. Errors name
/// `path` and what is wrong.
Status readGancArchive(const std::string &path, const std::vector<char> &bytes, Archive &archive,
                       std::string &specText);

/// Checks ganc_ops.json's `text` (the operators the archive calls from operator libraries,
/// each of which must be registered: --op-library loads them) and takes its measured
/// backward reads into `archive`.
Status checkOpNeeds(const std::string &path, const std::string &text, Archive &archive);

/// The identity of ganc's own archive: its spec text, its graphs' op lists and its
/// parameters' names, dtypes and shapes (a plan records it, as modelIdentity's).
std::string gancArchiveIdentity(const Archive &archive, const std::string &specText);

} // namespace ganc::frontend
