// The op list in the IR's terms: values by their op-list names, types from what the capture
// recorded, and each view or in-place op's alias read off its operator's schema.
#include "frontend/JointLowering.h"

#include "ir/Recipe.h"
#include "support/torch/Dtypes.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace ganc::frontend {

namespace {

/// A result the op list records ({"dtype": "float32", "shape": [...]}, or null).
ir::Type typeOf(const nlohmann::json &result) {
  if (!result.is_object())
    return ir::Type::other("any");
  auto dtype = scalarTypeNamed(result.value("dtype", std::string()));
  const std::string name = dtype ? dtypeName(*dtype) : "";
  if (!result.contains("shape") || !result["shape"].is_array())
    return ir::Type::unknownTensor(name);
  return ir::Type::tensor(name, result["shape"].get<std::vector<int64_t>>());
}

/// A node's result: its one tensor, or the tuple ganc.item takes apart; a tensor of unknown
/// shape where the op list records none.
ir::Type resultType(const nlohmann::json &node) {
  if (!node.contains("results") || !node["results"].is_array() || node["results"].empty())
    return ir::Type::unknownTensor();
  const nlohmann::json &results = node["results"];
  if (results.size() == 1)
    return typeOf(results[0]);
  std::vector<ir::Type> elements;
  for (const nlohmann::json &r : results)
    elements.push_back(typeOf(r));
  return ir::Type::other("tuple", std::move(elements));
}

class JointLowering {
public:
  JointLowering(const JointGraph &graph, ir::Phase &phase) : graph_(graph), phase_(phase) {}

  Status run() {
    for (const JointPort &port : graph_.inputs)
      GANC_TRY(input(port));
    for (const nlohmann::json &node : graph_.nodes)
      GANC_TRY(lowerNode(node).withContext("node " + node.value("out", std::string("?"))));
    for (const JointPort &port : graph_.outputs)
      GANC_TRY(output(port));
    return Status::ok();
  }

private:
  Expected<ir::Value *> valueNamed(const std::string &name) {
    auto found = values_.find(name);
    if (found == values_.end())
      return Status::error("value '" + name + "' is used before it is made");
    return found->second;
  }

  ir::Op &append(std::string name, std::string symbol = "") {
    auto op = std::make_unique<ir::Op>();
    op->name = std::move(name);
    op->symbol = std::move(symbol);
    phase_.joint.ops.push_back(std::move(op));
    return *phase_.joint.ops.back();
  }

  Status define(ir::Op &op, const std::string &name, ir::Type type) {
    if (values_.count(name))
      return Status::error("value '" + name + "' is made twice");
    ir::Value *v = phase_.newValue(name, std::move(type));
    v->definingOp = &op;
    op.results.push_back(v);
    values_[name] = v;
    return Status::ok();
  }

  Status input(const JointPort &port) {
    static const std::map<std::string, const char *> ops = {{"parameter", ir::joint::kParam},
                                                            {"buffer", ir::joint::kBuffer},
                                                            {"input", ir::joint::kInput},
                                                            {"seed", ir::joint::kSeed},
                                                            {"constant", ir::joint::kConstant}};
    auto op = ops.find(port.kind);
    if (op == ops.end())
      return Status::error("input " + port.name + " is of unknown kind '" + port.kind + "'");
    ir::Type type = ir::Type::unknownTensor();
    auto constant = graph_.constants.find(port.name);
    if (port.kind == "constant" && constant != graph_.constants.end())
      type = ir::Type::tensor(dtypeName(constant->second.scalar_type()),
                              constant->second.sizes().vec());
    else if (!port.dtype.empty())
      type = typeOf({{"dtype", port.dtype}, {"shape", port.shape}});
    return define(append(op->second, port.kind == "seed" ? "" : port.name), port.value,
                  std::move(type));
  }

  Status lowerNode(const nlohmann::json &node) {
    static const nlohmann::json kNone = nlohmann::json::array();
    const nlohmann::json &args = node.contains("args") ? node["args"] : kNone;
    const std::string name = node.value("op", std::string());
    std::vector<std::string> names;
    valuesIn(args, names);
    if (node.contains("kwargs"))
      for (const auto &[key, value] : node["kwargs"].items())
        valuesIn(value, names);
    ir::Op &op = append(name == "getitem" ? ir::joint::kItem : name);
    for (const std::string &n : names) {
      auto v = valueNamed(n);
      if (!v)
        return v.status();
      op.operands.push_back(*v);
    }
    if (name == "getitem") {
      if (args.size() != 2 || !args[1].is_number_integer())
        return Status::error("getitem takes a value and an index");
      op.attributes.emplace_back("index", args[1].get<int64_t>());
    } else {
      GANC_TRY(aliasOf(node, args, op));
    }
    return define(op, node.value("out", std::string()), resultType(node));
  }

  /// The overload, and `view_of`: the operand whose storage the op's first result is (a view,
  /// an in-place op's self), read off the schema's alias sets.
  Status aliasOf(const nlohmann::json &node, const nlohmann::json &args, ir::Op &op) {
    const std::string overload = node.value("overload", std::string("default"));
    if (overload != "default")
      op.attributes.emplace_back("overload", overload);
    auto handle = c10::Dispatcher::singleton().findSchema(
        {op.name, overload == "default" ? std::string() : overload});
    if (!handle)
      return Status::error("the dispatcher knows no operator " + op.name + "." + overload);
    const c10::FunctionSchema &schema = handle->schema();
    if (schema.returns().empty() || !schema.returns()[0].alias_info())
      return Status::ok();
    const auto &sets = schema.returns()[0].alias_info()->beforeSets();
    int64_t operand = 0;
    for (size_t i = 0; i < args.size() && i < schema.arguments().size(); ++i) {
      std::vector<std::string> held;
      valuesIn(args[i], held);
      const c10::AliasInfo *info = schema.arguments()[i].alias_info();
      const bool direct = args[i].is_object() && args[i].contains("value");
      if (direct && info && std::any_of(sets.begin(), sets.end(), [&](const c10::Symbol &s) {
            return info->beforeSets().count(s) > 0;
          })) {
        op.attributes.emplace_back("view_of", operand);
        return Status::ok();
      }
      operand += static_cast<int64_t>(held.size());
    }
    return Status::ok();
  }

  Status output(const JointPort &port) {
    static const std::map<std::string, const char *> ops = {{"loss", ir::joint::kLoss},
                                                            {"gradient", ir::joint::kGradient},
                                                            {"buffer", ir::joint::kBufferOut},
                                                            {"stat", ir::joint::kStat}};
    auto op = ops.find(port.kind);
    if (op == ops.end())
      return Status::error("output " + port.name + " is of unknown kind '" + port.kind + "'");
    if (port.value.empty()) // a constant the graph gives: nothing computes it
      return Status::ok();
    auto v = valueNamed(port.value);
    if (!v)
      return v.status().withContext("output " + port.name);
    append(op->second, port.kind == "loss" ? "" : port.name).operands.push_back(*v);
    return Status::ok();
  }

  const JointGraph &graph_;
  ir::Phase &phase_;
  std::map<std::string, ir::Value *> values_;
};

} // namespace

Status lowerJointGraph(const JointGraph &graph, ir::Phase &phase) {
  phase.joint.ops.clear();
  phase.jointGroupedConvolutions = graph.groupedConvolutions;
  return JointLowering(graph, phase)
      .run()
      .withContext("the joint graph of phase '" + phase.key() + "'");
}

std::unique_ptr<ir::Phase> phaseOfJointGraph(const Archive &archive, const PhaseSpec &spec,
                                             int stage) {
  auto phase = std::make_unique<ir::Phase>();
  phase->name = spec.name;
  if (stage >= 0)
    phase->stage = archive.spec.stages->list[static_cast<size_t>(stage)].name;
  phase->method = spec.method;
  phase->updates = spec.updates;
  ir::setRecipe(*phase,
                {spec.interval, spec.accumulate, ir::autocastOf(precisionName(spec.precision))});
  phase->lossScaler = spec.lossScaler;
  phase->outputs = spec.outputs;
  // The inputs as the graph was captured with them.
  const JointGraph &graph = archive.jointGraphs.at(phase->key());
  for (const InputSpec &in : spec.inputs) {
    ir::Type type = ir::Type::unknownTensor();
    for (const JointPort &port : graph.inputs)
      if (port.kind == "input" && port.name == in.name && !port.dtype.empty()) {
        auto dtype = scalarTypeNamed(port.dtype);
        type = ir::Type::tensor(dtype ? dtypeName(*dtype) : "", port.shape);
      }
    phase->inputs.push_back({phase->newValue(in.name, type), inputSourceName(in.source)});
  }
  return phase;
}

Status lowerJointGraphs(const Archive &archive, ir::Module &module) {
  for (auto &phase : module.phases) {
    auto graph = archive.jointGraphs.find(phase->key());
    if (graph == archive.jointGraphs.end())
      continue;
    GANC_TRY(lowerJointGraph(graph->second, *phase).inFile(archive.path));
  }
  return Status::ok();
}

} // namespace ganc::frontend
