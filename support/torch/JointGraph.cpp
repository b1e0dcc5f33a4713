// Reading a phase's joint graph: its ports, its nodes, its constants, and its arguments decoded
// against each operator's schema (a JSON integer is an int where the schema wants an int or a
// Scalar and a double where it wants a float; a list becomes the list type the schema names).
// JointProgram runs it.
#include "support/torch/JointGraph.h"

#include "support/Files.h"
#include "support/Json.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/serialize.h>

#include <cmath>
#include <limits>

namespace ganc {

namespace {

using Values = std::map<std::string, c10::IValue>;

Expected<c10::ScalarType> dtypeNamed(const std::string &name) {
  static const std::map<std::string, c10::ScalarType> types = {{"float32", c10::kFloat},
                                                               {"float64", c10::kDouble},
                                                               {"float16", c10::kHalf},
                                                               {"bfloat16", c10::kBFloat16},
                                                               {"int64", c10::kLong},
                                                               {"int32", c10::kInt},
                                                               {"int16", c10::kShort},
                                                               {"int8", c10::kChar},
                                                               {"uint8", c10::kByte},
                                                               {"bool", c10::kBool},
                                                               {"complex64", c10::kComplexFloat},
                                                               {"complex128", c10::kComplexDouble}};
  auto found = types.find(name);
  if (found == types.end())
    return Status::error("dtype '" + name + "' is not one ganc runs");
  return found->second;
}

Expected<int64_t> enumNamed(const std::string &key, const std::string &name) {
  static const std::map<std::string, int64_t> names = {
      {"layout:strided", static_cast<int64_t>(c10::kStrided)},
      {"memory_format:contiguous_format", static_cast<int64_t>(c10::MemoryFormat::Contiguous)},
      {"memory_format:preserve_format", static_cast<int64_t>(c10::MemoryFormat::Preserve)},
      {"memory_format:channels_last", static_cast<int64_t>(c10::MemoryFormat::ChannelsLast)},
      {"memory_format:channels_last_3d", static_cast<int64_t>(c10::MemoryFormat::ChannelsLast3d)}};
  auto found = names.find(key + ":" + name);
  if (found == names.end())
    return Status::error(key + " '" + name + "' is not one ganc runs");
  return found->second;
}

double realOf(const nlohmann::json &j) {
  if (j.is_number())
    return j.get<double>();
  const std::string text = j.get<std::string>(); // Python's repr of a non-finite float
  if (text == "nan")
    return std::numeric_limits<double>::quiet_NaN();
  return text[0] == '-' ? -std::numeric_limits<double>::infinity()
                        : std::numeric_limits<double>::infinity();
}

c10::TypePtr unwrapped(const c10::TypePtr &type) {
  if (type->kind() == c10::TypeKind::OptionalType)
    return type->castRaw<c10::OptionalType>()->getElementType();
  return type;
}

Expected<c10::IValue> decode(const nlohmann::json &j, const c10::TypePtr &type,
                             const Values &values);

/// A JSON list as the list type `type` names (int[], float[], bool[], Tensor[], Tensor?[]).
Expected<c10::IValue> decodeList(const nlohmann::json &j, const c10::TypePtr &type,
                                 const Values &values) {
  const c10::TypePtr list = unwrapped(type);
  if (list->kind() != c10::TypeKind::ListType)
    return Status::error("a list where the schema takes " + type->str());
  const c10::TypePtr element = list->castRaw<c10::ListType>()->getElementType();
  const c10::TypePtr inner = unwrapped(element);
  std::vector<c10::IValue> items;
  for (const nlohmann::json &item : j) {
    auto value = decode(item, element, values);
    if (!value)
      return value.status();
    items.push_back(value.take());
  }
  switch (inner->kind()) {
  case c10::TypeKind::IntType:
  case c10::TypeKind::SymIntType: {
    c10::List<int64_t> out;
    for (const c10::IValue &v : items)
      out.push_back(v.toInt());
    return c10::IValue(out);
  }
  case c10::TypeKind::FloatType: {
    c10::List<double> out;
    for (const c10::IValue &v : items)
      out.push_back(v.isInt() ? static_cast<double>(v.toInt()) : v.toDouble());
    return c10::IValue(out);
  }
  case c10::TypeKind::BoolType: {
    c10::List<bool> out;
    for (const c10::IValue &v : items)
      out.push_back(v.toBool());
    return c10::IValue(out);
  }
  case c10::TypeKind::TensorType: {
    if (element->kind() == c10::TypeKind::OptionalType) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue &v : items)
        out.push_back(v.isNone() ? std::optional<at::Tensor>() : v.toTensor());
      return c10::IValue(out);
    }
    c10::List<at::Tensor> out;
    for (const c10::IValue &v : items)
      out.push_back(v.toTensor());
    return c10::IValue(out);
  }
  default:
    return Status::error("a list of " + element->str() + " has no form here");
  }
}

Expected<c10::IValue> decodeTagged(const nlohmann::json &j, const Values &values) {
  if (j.contains("value")) {
    auto found = values.find(j["value"].get<std::string>());
    if (found == values.end())
      return Status::error("value '" + j["value"].get<std::string>() +
                           "' is used before it is made");
    return found->second;
  }
  if (j.contains("bool"))
    return c10::IValue(j["bool"].get<bool>());
  if (j.contains("float"))
    return c10::IValue(realOf(j["float"]));
  if (j.contains("str"))
    return c10::IValue(j["str"].get<std::string>());
  if (j.contains("device"))
    return c10::IValue(c10::Device(j["device"].get<std::string>()));
  if (j.contains("dtype")) {
    auto type = dtypeNamed(j["dtype"].get<std::string>());
    if (!type)
      return type.status();
    return c10::IValue(static_cast<int64_t>(*type));
  }
  for (const char *key : {"layout", "memory_format"})
    if (j.contains(key)) {
      auto value = enumNamed(key, j[key].get<std::string>());
      if (!value)
        return value.status();
      return c10::IValue(*value);
    }
  return Status::error("an argument of unknown form " + j.dump().substr(0, 80));
}

/// A Python number where the schema takes a Tensor (`aten::add.Tensor(x, 1)`: Python's
/// argument parser wraps it): a 0-dim tensor marked as a wrapped number, so that type
/// promotion treats it as eager does (it does not widen the other operand's dtype).
c10::IValue wrappedNumber(const c10::IValue &value) {
  at::Tensor t = value.isInt()      ? at::scalar_to_tensor(value.toInt())
                 : value.isDouble() ? at::scalar_to_tensor(value.toDouble())
                                    : at::scalar_to_tensor(value.toBool());
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

Expected<c10::IValue> decode(const nlohmann::json &j, const c10::TypePtr &type,
                             const Values &values) {
  if (j.is_null())
    return c10::IValue();
  if (unwrapped(type)->kind() == c10::TypeKind::TensorType && !j.is_array()) {
    auto value = j.is_object() ? decodeTagged(j, values)
                               : Expected<c10::IValue>(c10::IValue(j.get<int64_t>()));
    if (value && (value->isInt() || value->isDouble() || value->isBool()))
      return wrappedNumber(*value);
    return value;
  }
  if (j.is_object())
    return decodeTagged(j, values);
  if (j.is_array())
    return decodeList(j, type, values);
  if (j.is_number_integer()) {
    if (unwrapped(type)->kind() == c10::TypeKind::FloatType)
      return c10::IValue(j.get<double>());
    return c10::IValue(j.get<int64_t>());
  }
  return Status::error("an argument of unknown form " + j.dump().substr(0, 80));
}

Expected<JointPort> portOf(const nlohmann::json &j) {
  if (!j.is_object() || !j.contains("kind") || !j.contains("name") || !j["kind"].is_string() ||
      !j["name"].is_string())
    return Status::error("a port without kind and name");
  JointPort port;
  port.kind = j["kind"].get<std::string>();
  port.name = j["name"].get<std::string>();
  port.encoded = j.value("value", nlohmann::json());
  if (j.contains("shape") && j["shape"].is_array())
    for (const nlohmann::json &d : j["shape"])
      port.shape.push_back(d.get<int64_t>());
  port.dtype = j.value("dtype", std::string());
  if (port.encoded.is_string())
    port.value = port.encoded.get<std::string>();
  else if (port.encoded.is_object() && port.encoded.contains("value"))
    port.value = port.encoded["value"].get<std::string>();
  return port;
}

} // namespace

Expected<c10::IValue> decodeArgument(const nlohmann::json &j, const c10::TypePtr &type,
                                     const std::map<std::string, c10::IValue> &values) {
  return decode(j, type, values);
}

Expected<c10::ScalarType> scalarTypeNamed(const std::string &name) { return dtypeNamed(name); }

void valuesIn(const nlohmann::json &argument, std::vector<std::string> &names) {
  if (argument.is_object() && argument.contains("value"))
    names.push_back(argument["value"].get<std::string>());
  else if (argument.is_array())
    for (const nlohmann::json &item : argument)
      valuesIn(item, names);
}

std::vector<std::string> JointGraph::used() const {
  std::vector<std::string> names;
  for (const JointPort &port : outputs)
    if (port.kind == "gradient")
      names.push_back(port.name);
  return names;
}

std::string JointGraph::lossDtype() const {
  for (const JointPort &port : outputs) {
    if (port.kind != "loss")
      continue;
    for (const nlohmann::json &node : nodes)
      if (node.value("out", std::string()) == port.value && node.contains("results") &&
          node["results"].is_array() && !node["results"].empty() && node["results"][0].is_object())
        return node["results"][0].value("dtype", std::string());
  }
  return "";
}

Expected<c10::IValue> readTorchSave(const std::string &path, const std::string &what) {
  const std::string where = what.empty() ? path : what + " " + path;
  auto bytes = readFile(path);
  if (!bytes)
    return what.empty() ? bytes.status() : bytes.status().withContext(what);
  GANC_TRY(checkZipArchive(*bytes).withContext(where));
  try {
    return torch::pickle_load(*bytes);
  } catch (const std::exception &e) {
    const std::string text = e.what();
    return Status::error(where + ": not a torch.save file (" + text.substr(0, text.find('\n')) +
                         ")");
  }
}

Expected<JointGraph> jointGraphOf(const c10::IValue &stored, const std::string &path) {
  if (!stored.isGenericDict() || !stored.toGenericDict().contains("graph") ||
      !stored.toGenericDict().at("graph").isString())
    return Status::error(path + ": not a ganc joint graph (no 'graph' op list)");
  const auto dict = stored.toGenericDict();
  auto list = parseJson(dict.at("graph").toStringRef(), path);
  if (!list)
    return list.status();
  const nlohmann::json &j = *list;
  if (!j.is_object() || j.value("ganc_joint", 0) != 1)
    return Status::error(path + ": an op list of another version (this ganc reads ganc_joint 1)");
  JointGraph graph;
  graph.phase = j.value("phase", std::string());
  graph.method = j.value("method", std::string());
  graph.precision = j.value("precision", std::string());
  graph.batch = j.value("batch", int64_t{0});
  graph.groupedConvolutions = j.value("grouped_convolutions", int64_t{-1});
  for (const char *key : {"inputs", "outputs"})
    for (const nlohmann::json &p : j.value(key, nlohmann::json::array())) {
      auto port = portOf(p);
      if (!port)
        return port.status().withContext(path);
      (std::string(key) == "inputs" ? graph.inputs : graph.outputs).push_back(port.take());
    }
  graph.nodes = j.value("nodes", nlohmann::json::array());
  if (dict.contains("constants") && dict.at("constants").isGenericDict())
    for (const auto &entry : dict.at("constants").toGenericDict())
      graph.constants[entry.key().toStringRef()] = entry.value().toTensor();
  return graph;
}

Expected<JointGraph> readJointGraph(const std::string &path) {
  auto read = readTorchSave(path, "");
  if (!read)
    return read.status();
  return jointGraphOf(read.take(), path);
}

Expected<JointGraph> jointGraphFromBytes(const std::vector<char> &bytes, const std::string &where) {
  GANC_TRY(checkZipArchive(bytes).withContext(where));
  try {
    return jointGraphOf(torch::pickle_load(bytes), where);
  } catch (const std::exception &e) {
    const std::string text = e.what();
    return Status::error(where + ": not a torch.save file (" + text.substr(0, text.find('\n')) +
                         ")");
  }
}

} // namespace ganc
