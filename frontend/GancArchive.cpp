// ganc's own archive: a torch.save container of the spec, the state and the captured graphs.
#include "frontend/GancArchive.h"

#include "support/Hash.h"
#include "support/torch/Dtypes.h"
#include "support/torch/TorchError.h"

#include <torch/serialize.h>

#include <cstdio>
#include <set>

namespace ganc::frontend {

namespace jit = torch::jit;

/// The version of ganc's own archive this ganc reads (ganc.joint.ARCHIVE_VERSION).
constexpr int64_t kArchiveVersion = 1;

bool isGancArchive(const std::vector<std::string> &entries) {
  bool pickle = false;
  for (const std::string &name : entries) {
    if (name.find("/code/") != std::string::npos)
      return false;
    pickle |= name.size() >= 9 && name.compare(name.size() - 9, 9, "/data.pkl") == 0;
  }
  return pickle;
}

namespace {

/// A module with no methods and no code: a class of its own holding attributes.
jit::Module containerModule() {
  auto unit = std::make_shared<jit::CompilationUnit>();
  jit::Module module(c10::QualifiedName("__torch__.ganc.Container"), unit, /*shouldMangle=*/true);
  module.register_attribute("training", c10::BoolType::get(), true);
  return module;
}

/// The submodule holding dotted `name`'s last part, made where missing; the last part is
/// returned in `last`.
jit::Module ownerOf(jit::Module root, const std::string &name, std::string &last) {
  size_t begin = 0;
  while (true) {
    const size_t dot = name.find('.', begin);
    if (dot == std::string::npos) {
      last = name.substr(begin);
      return root;
    }
    const std::string part = name.substr(begin, dot - begin);
    if (!root.hasattr(part))
      root.register_module(part, containerModule());
    root = root.attr(part).toModule();
    begin = dot + 1;
  }
}

Expected<c10::Dict<c10::IValue, c10::IValue>> dictAt(const c10::Dict<c10::IValue, c10::IValue> &d,
                                                     const std::string &key,
                                                     const std::string &path) {
  if (!d.contains(key) || !d.at(key).isGenericDict())
    return Status::error(path + ": ganc archive without its '" + key + "' table");
  return d.at(key).toGenericDict();
}

/// The module of the archive's state: every tensor registered under its state-dict name, in
/// the order `order` gives (each module's own tensors before its submodules', as PyTorch
/// lists them), and each stage attribute as an int attribute.
Status buildModule(const c10::Dict<c10::IValue, c10::IValue> &stored, const std::string &path,
                   Archive &archive) {
  auto parameters = dictAt(stored, "parameters", path);
  auto buffers = dictAt(stored, "buffers", path);
  auto attributes = dictAt(stored, "attributes", path);
  if (!parameters || !buffers || !attributes)
    return !parameters ? parameters.status() : !buffers ? buffers.status() : attributes.status();
  std::set<std::string> frozen;
  if (stored.contains("frozen") && stored.at("frozen").isList())
    for (const c10::IValue &name : stored.at("frozen").toListRef())
      frozen.insert(name.toStringRef());
  archive.module = containerModule();
  std::string last;
  if (!stored.contains("order") || !stored.at("order").isList())
    return Status::error(path + ": ganc archive without its 'order' list");
  for (const c10::IValue &entry : stored.at("order").toListRef()) {
    const std::string name = entry.toStringRef();
    const bool isParameter = parameters->contains(name);
    if (!isParameter && !buffers->contains(name))
      return Status::error(path + ": 'order' names '" + name +
                           "', which is neither a parameter nor a buffer of the archive");
    at::Tensor t = (isParameter ? parameters->at(name) : buffers->at(name)).toTensor();
    jit::Module owner = ownerOf(archive.module, name, last);
    if (isParameter)
      owner.register_parameter(last, t.requires_grad_(!frozen.count(name)), false);
    else
      owner.register_buffer(last, t);
  }
  for (const auto &entry : *attributes) {
    jit::Module owner = ownerOf(archive.module, entry.key().toStringRef(), last);
    owner.register_attribute(last, c10::IntType::get(), entry.value().toInt());
  }
  return Status::ok();
}

} // namespace

Status readGancArchive(const std::string &path, const std::vector<char> &bytes, Archive &archive,
                       std::string &specText) {
  archive.torchscript = false;
  try {
    c10::IValue read = torch::pickle_load(bytes);
    if (!read.isGenericDict() || !read.toGenericDict().contains("ganc_archive"))
      return Status::error(path + ": a torch.save file, but not a ganc archive (write one with "
                                  "ganc.export)");
    const auto stored = read.toGenericDict();
    const c10::IValue version = stored.at("ganc_archive");
    if (!version.isInt() || version.toInt() != kArchiveVersion)
      return Status::error(path + ": a ganc archive of another version (this ganc reads version " +
                           std::to_string(kArchiveVersion) + ")");
    if (stored.contains("spec") && stored.at("spec").isString())
      specText = stored.at("spec").toStringRef();
    GANC_TRY(buildModule(stored, path, archive));
    auto joint = dictAt(stored, "joint", path);
    if (!joint)
      return joint.status();
    for (const auto &entry : *joint) {
      const std::string key = entry.key().toStringRef();
      auto graph = jointGraphOf(entry.value(), path + ": the joint graph of phase '" + key + "'");
      if (!graph)
        return graph.status();
      archive.jointGraphs.emplace(key, graph.take());
    }
    if (stored.contains("sample")) {
      auto graph = jointGraphOf(stored.at("sample"), path + ": the sample grid's graph");
      if (!graph)
        return graph.status();
      archive.sampleGraph = graph.take();
    }
    if (stored.contains("ops") && stored.at("ops").isString())
      GANC_TRY(checkOpNeeds(path, stored.at("ops").toStringRef(), archive));
  } catch (const std::exception &e) {
    return Status::error(path + ": not a whole ganc archive (" + firstLine(e) + ")");
  }
  return Status::ok();
}

std::string gancArchiveIdentity(const Archive &archive, const std::string &specText) {
  uint64_t h = kDigestStart;
  auto mix = [&h](const std::string &text) { h = digestWords(h, text.c_str(), text.size() + 1); };
  mix("ganc archive");
  mix(specText);
  auto hashGraph = [&](const std::string &key, const JointGraph &graph) {
    mix(key);
    mix(graph.nodes.dump());
    for (const auto *ports : {&graph.inputs, &graph.outputs})
      for (const JointPort &port : *ports)
        mix(port.kind + " " + port.name + " " + port.value);
  };
  for (const auto &[key, graph] : archive.jointGraphs)
    hashGraph(key, graph);
  if (archive.sampleGraph)
    hashGraph("sample", *archive.sampleGraph);
  for (const auto &p : archive.module.named_parameters(/*recurse=*/true)) {
    mix(p.name + " " + dtypeName(p.value.scalar_type()));
    for (int64_t d : p.value.sizes())
      mix(std::to_string(d));
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

} // namespace ganc::frontend
