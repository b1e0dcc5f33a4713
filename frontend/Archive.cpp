// Archive loading: the TorchScript module, its spec, the checks between them, its identity.
#include "frontend/Archive.h"

#include "frontend/GancArchive.h"

#include "support/Files.h"
#include "support/Json.h"
#include "support/torch/Dtypes.h"
#include "support/torch/TorchError.h"

#include <caffe2/serialize/inline_container.h>
#include <dlfcn.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

namespace ganc::frontend {

namespace jit = torch::jit;

std::pair<c10::intrusive_ptr<c10::ivalue::Object>, std::string>
resolvePath(const torch::jit::Module &root, const std::string &path) {
  c10::intrusive_ptr<c10::ivalue::Object> object = root._ivalue();
  size_t begin = 0;
  while (true) {
    size_t dot = path.find('.', begin);
    std::string name = path.substr(begin, dot == std::string::npos ? dot : dot - begin);
    if (dot == std::string::npos)
      return {object, name};
    auto slot = object->type()->findAttributeSlot(name);
    if (!slot || !object->getSlot(*slot).isObject())
      return {nullptr, name};
    object = object->getSlot(*slot).toObject();
    begin = dot + 1;
  }
}

namespace {

uint64_t fnv1a(uint64_t h, const void *data, size_t size) {
  const auto *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

uint64_t fnv1a(uint64_t h, const std::string &s) { return fnv1a(h, s.data(), s.size() + 1); }

/// Every stage attribute is a plain int attribute, and every block a stage grows a submodule.
Status checkStages(const Archive &archive) {
  const StagesSpec &stages = *archive.spec.stages;
  for (const std::string &path : stages.attributes) {
    auto [object, name] = resolvePath(archive.module, path);
    auto slot = object ? object->type()->findAttributeSlot(name) : std::nullopt;
    if (!slot)
      return Status::error(archive.path + ": stages: attribute '" + path +
                           "' does not exist in the model");
    if (!object->getSlot(*slot).isInt() || object->type()->is_parameter(*slot) ||
        object->type()->is_buffer(*slot))
      return Status::error(archive.path + ": stages: attribute '" + path +
                           "' is not an int module attribute (it holds " +
                           object->getSlot(*slot).tagKind() + ")");
  }
  for (const StageSpec &stage : stages.list)
    for (const std::string &path : stage.grows) {
      auto [object, name] = resolvePath(archive.module, path);
      auto slot = object ? object->type()->findAttributeSlot(name) : std::nullopt;
      if (!slot || !object->getSlot(*slot).isObject())
        return Status::error(archive.path + ": stage '" + stage.name + "' grows '" + path +
                             "', which is not a submodule of the model");
    }
  return Status::ok();
}

} // namespace

std::string modelIdentity(const std::string &path, const torch::jit::Module &module,
                          const std::string &specText) {
  uint64_t h = 1469598103934665603ULL;
  caffe2::serialize::PyTorchStreamReader reader(path);
  std::vector<std::string> records = reader.getAllRecords();
  std::sort(records.begin(), records.end());
  for (const std::string &name : records) {
    if (name.rfind("code/", 0) != 0 || name.find(".debug_pkl") != std::string::npos)
      continue;
    auto [data, size] = reader.getRecord(name);
    h = fnv1a(h, name);
    h = fnv1a(h, data.get(), size);
  }
  h = fnv1a(h, specText);
  for (const auto &p : module.named_parameters(/*recurse=*/true)) {
    h = fnv1a(h, p.name);
    h = fnv1a(h, dtypeName(p.value.scalar_type()));
    for (int64_t d : p.value.sizes())
      h = fnv1a(h, &d, sizeof(d));
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

namespace {

/// The parameters `path` names: itself, or every parameter of the submodule it names.
std::vector<std::string> parametersWithin(const std::vector<std::string> &names,
                                          const std::string &path) {
  std::vector<std::string> within;
  for (const std::string &name : names)
    if (ir::isWithin(name, path))
      within.push_back(name);
  return within;
}

/// Resolves the `updates` paths and the optimizer groups against the module's parameters:
/// every path must name parameters, a parameter belongs to one group, every trained
/// parameter to some group (an `updates` path none covers gets a default Adam group named by
/// it, the broader path first), and every group steps something a phase trains.
Status resolveOptimizerGroups(Archive &archive) {
  Spec &spec = archive.spec;
  std::vector<std::string> names;
  for (const auto &p : archive.module.named_parameters(/*recurse=*/true))
    names.push_back(p.name);
  std::set<std::string> trained;
  for (const PhaseSpec &phase : spec.phases)
    for (const std::string &path : phase.updates) {
      auto within = parametersWithin(names, path);
      if (within.empty())
        return Status::error("phase '" + phase.name + "': updates '" + path +
                             "', which names no parameter or submodule with parameters");
      trained.insert(within.begin(), within.end());
    }
  auto &groupOf = archive.groupOf;
  for (const auto &[group, optimizer] : spec.optimizers)
    for (const std::string &path : optimizer.params) {
      auto within = parametersWithin(names, path);
      if (within.empty())
        return Status::error("optimizer of '" + group + "': '" + path +
                             "' names no parameter or submodule with parameters");
      for (const std::string &name : within) {
        auto [it, added] = groupOf.emplace(name, group);
        if (!added && it->second != group)
          return Status::error("parameter '" + name + "' is in optimizer groups '" + it->second +
                               "' and '" + group + "'; a parameter belongs to one group");
      }
    }
  std::vector<std::string> paths = spec.updatedPaths();
  std::sort(paths.begin(), paths.end(), [](const std::string &a, const std::string &b) {
    return a.size() < b.size() || (a.size() == b.size() && a < b);
  });
  for (const std::string &path : paths)
    for (const std::string &name : parametersWithin(names, path)) {
      if (groupOf.count(name))
        continue;
      // A declared group of this name steps other paths: the parameter has no group.
      if (spec.optimizers.count(path) &&
          spec.optimizers.at(path).params != std::vector<std::string>{path})
        return Status::error("parameter '" + name + "' is trained but in no optimizer group");
      auto &group = spec.optimizers[path];
      if (group.type.empty()) { // a default group: torch.optim.Adam's defaults
        group.type = "adam";
        group.params = {path};
      }
      groupOf[name] = path;
    }
  for (const auto &[group, optimizer] : spec.optimizers)
    if (std::none_of(groupOf.begin(), groupOf.end(), [&](const auto &entry) {
          return entry.second == group && trained.count(entry.first);
        }))
      return Status::error("optimizer of '" + group + "' steps no parameter that a phase trains");
  for (auto it = groupOf.begin(); it != groupOf.end();)
    it = trained.count(it->first) ? std::next(it) : groupOf.erase(it);
  return Status::ok();
}

} // namespace

Status loadOpLibraries(const std::vector<std::string> &paths) {
  for (const std::string &library : paths) {
    // RTLD_GLOBAL: a library's operators may call another's; the handle stays open for the
    // life of the process, as torch.ops.load_library leaves it.
    if (dlopen(library.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char *why = dlerror();
      return Status::error("--op-library " + library + ": " + (why ? why : "cannot be loaded"));
    }
  }
  return Status::ok();
}

namespace {

/// The phases' joint graphs ganc.export(joint=True) kept (extra/ganc_joint/PHASE.pt), as
/// their bytes by phase name.
Status readJointGraphs(const std::string &path, const std::vector<char> &bytes, Archive &archive) {
  const std::string marker = "/extra/ganc_joint/";
  auto entries = readZipEntries(bytes, [&](const std::string &name) {
    return name.find(marker) != std::string::npos && name.size() > 3 &&
           name.compare(name.size() - 3, 3, ".pt") == 0;
  });
  if (!entries)
    return entries.status().withContext(path);
  for (auto &[name, content] : *entries) {
    const size_t start = name.find(marker) + marker.size();
    const std::string key = name.substr(start, name.size() - 3 - start);
    auto graph = jointGraphFromBytes(content, path + ": the joint graph of phase '" + key + "'");
    if (!graph)
      return graph.status();
    archive.jointGraphs.emplace(key, graph.take());
  }
  return Status::ok();
}

/// The operators an archive's code calls from operator libraries, as ganc.export recorded them
/// in its ganc_ops.json ({"libraries": ["libx.so", ...], "ops": ["ns::op", ...]}): each must be
/// registered (--op-library loads them) before the archive's code can be loaded. Its
/// "backward_reads" ({"ns::op": [[operand, ...], ...]}) goes into `archive`.
Status readOpLibraries(const std::string &path, const std::vector<char> &bytes, Archive &archive) {
  auto entries = readZipEntries(bytes, [](const std::string &name) {
    const std::string suffix = "/extra/ganc_ops.json"; // torch.jit.save's extra files
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  });
  if (!entries)
    return entries.status().withContext(path);
  if (entries->empty())
    return Status::ok();
  const std::vector<char> &text = entries->front().second;
  return checkOpNeeds(path, std::string(text.begin(), text.end()), archive);
}

} // namespace

Status checkOpNeeds(const std::string &path, const std::string &text, Archive &archive) {
  auto parsed = parseJson(text, path + ": ganc_ops.json");
  if (!parsed)
    return parsed.status();
  nlohmann::json &needs = *parsed;
  if (!needs.is_object() || !needs.contains("ops") || !needs["ops"].is_array() ||
      !needs.contains("libraries") || !needs["libraries"].is_array())
    return Status::error(path + ": ganc_ops.json is not what ganc.export writes");
  std::string libraries;
  for (const auto &library : needs["libraries"])
    libraries += (libraries.empty() ? "" : ", ") +
                 (library.is_string() ? library.get<std::string>() : std::string("?"));
  for (const auto &op : needs["ops"]) {
    const std::string name = op.is_string() ? op.get<std::string>() : "";
    if (name.find("::") != std::string::npos &&
        !torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(name)).empty())
      continue;
    return Status::error(path + ": needs the operator " + name + " from the operator library " +
                         libraries + ", which is not loaded: pass --op-library PATH/" + libraries +
                         " (to ganc compile and ganc train)");
  }
  if (needs.contains("backward_reads") && needs["backward_reads"].is_object())
    for (const auto &[op, rows] : needs["backward_reads"].items()) {
      std::vector<std::vector<int64_t>> reads;
      for (const auto &row : rows) {
        if (!row.is_array())
          return Status::error(path + ": ganc_ops.json is not what ganc.export writes");
        reads.emplace_back();
        for (const auto &i : row)
          if (i.is_number_integer())
            reads.back().push_back(i.get<int64_t>());
      }
      archive.opBackwardReads[op] = std::move(reads);
    }
  return Status::ok();
}

namespace {

/// The TorchScript archive's module and spec text; checks each phase's method.
Status readTorchScriptArchive(const std::string &path, const std::vector<char> &bytes,
                              Archive &archive, std::string &specText) {
  GANC_TRY(readOpLibraries(path, bytes, archive));
  GANC_TRY(readJointGraphs(path, bytes, archive));
  jit::ExtraFilesMap extra{{"ganc.json", ""}};
  try {
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    archive.module = jit::load(in, c10::kCPU, extra);
  } catch (const std::exception &e) {
    return Status::error(path + ": not a TorchScript archive (" + firstLine(e) + ")");
  }
  specText = extra["ganc.json"];
  return Status::ok();
}

/// Each phase's code: its method (a TorchScript archive's), or its joint graph for every stage
/// (ganc's own archive).
Status checkPhasesPresent(const Archive &archive) {
  const std::string &path = archive.path;
  for (const PhaseSpec &phase : archive.spec.phases) {
    std::string where = path + ": phase '" + phase.name + "'";
    if (!archive.torchscript) {
      std::vector<std::string> keys;
      if (archive.spec.stages)
        for (const StageSpec &stage : archive.spec.stages->list)
          keys.push_back(phase.name + "@" + stage.name);
      else
        keys.push_back(phase.name);
      for (const std::string &key : keys)
        if (!archive.jointGraphs.count(key))
          return Status::error(path + ": phase '" + key +
                               "' has no joint graph in the archive (was it exported?)");
      continue;
    }
    if (!archive.module.find_method(phase.method))
      return Status::error(where + ": method '" + phase.method +
                           "' does not exist in the archive (was it exported?)");
    size_t arity = archive.module.get_method(phase.method).function().num_inputs() - 1;
    if (arity != phase.inputs.size())
      return Status::error(where + ": method '" + phase.method + "' takes " +
                           std::to_string(arity) + " inputs but the spec lists " +
                           std::to_string(phase.inputs.size()));
  }
  return Status::ok();
}

} // namespace

Expected<Archive> loadArchive(const std::string &path, const std::string &planSpec) {
  auto bytes = readFile(path);
  if (!bytes)
    return bytes.status();
  std::vector<std::string> entries;
  GANC_TRY(checkZipArchive(*bytes, &entries).withContext(path));
  Archive archive;
  archive.path = path;
  std::string specText;
  if (isGancArchive(entries))
    GANC_TRY(readGancArchive(path, *bytes, archive, specText));
  else
    GANC_TRY(readTorchScriptArchive(path, *bytes, archive, specText));
  if (specText.empty())
    return Status::error(path + ": the archive has no ganc.json spec; export it with "
                                "ganc.export(model, path, spec) (see docs/spec.md)");
  auto spec = parseSpec(planSpec.empty() ? specText : planSpec);
  if (!spec)
    return spec.status().withContext(planSpec.empty() ? path : "the plan's spec for " + path);
  archive.spec = spec.take();
  GANC_TRY(checkPhasesPresent(archive));
  GANC_TRY(resolveOptimizerGroups(archive).withContext(path));
  if (archive.spec.ema) {
    const EmaSpec &ema = *archive.spec.ema;
    auto slotOf = [&](const std::string &name) {
      return archive.module._ivalue()->type()->findAttributeSlot(name);
    };
    if (!slotOf(ema.submodule) || !slotOf(ema.copy))
      return Status::error(path + ": ema: '" + (slotOf(ema.submodule) ? ema.copy : ema.submodule) +
                           "' is not a submodule");
    auto source = archive.module.attr(ema.submodule).toModule().named_parameters();
    auto copy = archive.module.attr(ema.copy).toModule().named_parameters();
    if (source.size() != copy.size())
      return Status::error(path + ": ema: '" + ema.copy + "' does not mirror '" + ema.submodule +
                           "' (different parameters)");
    for (auto a = source.begin(), b = copy.begin(); a != source.end(); ++a, ++b)
      if ((*a).name != (*b).name || !(*a).value.sizes().equals((*b).value.sizes()))
        return Status::error(path + ": ema: '" + ema.copy + "." + (*b).name + "' does not match '" +
                             ema.submodule + "." + (*a).name + "'");
  }
  if (archive.spec.stages)
    GANC_TRY(checkStages(archive));
  if (archive.spec.sample && !archive.torchscript && !archive.sampleGraph)
    return Status::error(path + ": the spec samples, but the archive holds no sample graph "
                                "(export it again with ganc.export)");
  if (archive.spec.sample && archive.torchscript && !archive.spec.sample->method.empty() &&
      !archive.module.find_method(archive.spec.sample->method))
    return Status::error(path + ": sample method '" + archive.spec.sample->method +
                         "' does not exist (export it with the phases: ganc.export does)");
  if (archive.spec.sample && archive.spec.sample->method.empty()) {
    auto slot = archive.module._ivalue()->type()->findAttributeSlot(archive.spec.sample->submodule);
    if (!slot)
      return Status::error(path + ": sample submodule '" + archive.spec.sample->submodule +
                           "' does not exist");
  }
  try {
    archive.identity = archive.torchscript ? modelIdentity(path, archive.module, specText)
                                           : gancArchiveIdentity(archive, specText);
  } catch (const std::exception &e) {
    return Status::error(path + ": cannot read the archive's records (" + firstLine(e) + ")");
  }
  archive.module.train(true);
  return archive;
}

} // namespace ganc::frontend
