// The joint graph's prepared form and its run: a table of slots in place of the interpreter's
// map of names, the dispatcher's handles found once, and lifetimes read off the op list.
#include "backend/JointProgram.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/irange.h>

#include <algorithm>

namespace ganc::backend {

namespace {

bool holdsValue(const nlohmann::json &j) {
  if (j.is_object())
    return j.contains("value");
  if (j.is_array())
    return std::any_of(j.begin(), j.end(), holdsValue);
  return false;
}

std::string shapeText(c10::IntArrayRef shape) { return c10::str(shape); }

} // namespace

Expected<std::shared_ptr<const JointProgram>>
JointProgram::compile(JointGraph graph, const std::optional<std::vector<Launch>> &launches) {
  auto p = std::shared_ptr<JointProgram>(new JointProgram());
  p->graph_ = std::move(graph);
  std::map<std::string, int> slotOf;
  for (const JointPort &port : p->graph_.inputs) {
    const int slot = static_cast<int>(p->slots_++);
    slotOf[port.value] = slot;
    p->root_.push_back(slot);
    p->inputs_.push_back({port.name, slot, c10::IValue()});
  }
  for (const nlohmann::json &node : p->graph_.nodes)
    GANC_TRY(p->prepareStep(node, slotOf)
                 .withContext("phase '" + p->graph_.phase + "', node " +
                              node.value("out", std::string("?"))));
  for (const JointPort &port : p->graph_.outputs) {
    Port out{port.name, -1, c10::IValue()};
    if (!port.value.empty()) {
      auto found = slotOf.find(port.value);
      if (found == slotOf.end())
        return Status::error("phase '" + p->graph_.phase + "': output " + port.name +
                             " is value '" + port.value + "', which no node makes");
      out.slot = found->second;
    } else {
      auto constant = decodeArgument(port.encoded, c10::AnyType::get(), {});
      if (!constant)
        return constant.status().withContext("phase '" + p->graph_.phase + "', output " +
                                             port.name);
      out.constant = constant.take();
    }
    p->outputs_.push_back(std::move(out));
  }
  GANC_TRY(p->planLifetimes());
  if (launches)
    GANC_TRY(p->placeLaunches(*launches).withContext("phase '" + p->graph_.phase + "'"));
  return std::shared_ptr<const JointProgram>(std::move(p));
}

Expected<JointProgram::Arg>
JointProgram::prepareArgument(const c10::Argument &arg, const nlohmann::json *given,
                              const std::map<std::string, int> &slotOf) {
  auto slotNamed = [&](const std::string &name) -> Expected<int> {
    auto found = slotOf.find(name);
    if (found == slotOf.end())
      return Status::error("value '" + name + "' is used before it is made");
    return found->second;
  };
  Arg a;
  a.type = arg.type();
  if (given == nullptr) {
    if (!arg.default_value())
      return Status::error("not given, and it has no default");
    a.constant = *arg.default_value();
  } else if (given->is_object() && given->contains("value")) {
    auto slot = slotNamed((*given)["value"].get<std::string>());
    if (!slot)
      return slot.status();
    a.slot = *slot;
  } else if (holdsValue(*given)) {
    a.list = given;
    std::vector<std::string> names;
    valuesIn(*given, names);
    for (const std::string &n : names) {
      auto slot = slotNamed(n);
      if (!slot)
        return slot.status();
      a.listValues.emplace_back(n, *slot);
    }
  } else {
    auto constant = decodeArgument(*given, arg.type(), {});
    if (!constant)
      return constant.status();
    a.constant = constant.take();
  }
  return a;
}

Status JointProgram::prepareStep(const nlohmann::json &node, std::map<std::string, int> &slotOf) {
  Step step;
  step.name = node.value("out", std::string());
  // References into the graph's nodes, which the program keeps: a list argument is decoded
  // from its node at each run.
  static const nlohmann::json kNone = nlohmann::json::array(),
                              kNoKeywords = nlohmann::json::object();
  const nlohmann::json &args = node.contains("args") ? node["args"] : kNone;
  auto slotNamed = [&](const std::string &name) -> Expected<int> {
    auto found = slotOf.find(name);
    if (found == slotOf.end())
      return Status::error("value '" + name + "' is used before it is made");
    return found->second;
  };
  if (node.value("op", std::string()) == "getitem") {
    if (args.size() != 2 || !args[0].is_object() || !args[0].contains("value") ||
        !args[1].is_number_integer())
      return Status::error("getitem takes a value and an index");
    auto from = slotNamed(args[0]["value"].get<std::string>());
    if (!from)
      return from.status();
    step.args.push_back({*from, c10::IValue(), nullptr, {}, nullptr});
    step.item = args[1].get<int64_t>();
  } else {
    const std::string name = node.value("op", std::string());
    const std::string overload = node.value("overload", std::string("default"));
    auto handle = c10::Dispatcher::singleton().findSchema(
        {name, overload == "default" ? std::string() : overload});
    if (!handle)
      return Status::error("the dispatcher knows no operator " + name + "." + overload);
    const c10::FunctionSchema &schema = handle->schema();
    const nlohmann::json &kwargs = node.contains("kwargs") ? node["kwargs"] : kNoKeywords;
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const c10::Argument &arg = schema.arguments()[i];
      const nlohmann::json *given = i < args.size()               ? &args[i]
                                    : kwargs.contains(arg.name()) ? &kwargs[arg.name()]
                                                                  : nullptr;
      auto a = prepareArgument(arg, given, slotOf);
      if (!a)
        return a.status().withContext(name + "'s '" + arg.name() + "'");
      step.args.push_back(a.take());
    }
    step.returns = schema.returns().size();
    step.op = *handle;
  }
  step.out = static_cast<int>(slots_++);
  root_.push_back(step.out);
  // A view, or an in-place op's result, is its argument's tensor: one alias root for both.
  if (step.op && step.returns >= 1 && step.op->schema().returns()[0].alias_info()) {
    const auto &sets = step.op->schema().returns()[0].alias_info()->beforeSets();
    for (size_t i = 0; i < step.args.size(); ++i) {
      const c10::AliasInfo *info = step.op->schema().arguments()[i].alias_info();
      if (step.args[i].slot >= 0 && info &&
          std::any_of(sets.begin(), sets.end(),
                      [&](const c10::Symbol &s) { return info->beforeSets().count(s) > 0; }))
        root_[step.out] = root_[step.args[i].slot];
    }
  }
  slotOf[step.name] = step.out;
  steps_.push_back(std::move(step));
  return Status::ok();
}

Status JointProgram::planLifetimes() {
  // The step after which each slot is read no more (-1: never read), and the step making it.
  std::vector<int> lastUse(slots_, -1), madeAt(slots_, -1);
  for (size_t i = 0; i < steps_.size(); ++i) {
    madeAt[steps_[i].out] = static_cast<int>(i);
    for (const Arg &a : steps_[i].args) {
      if (a.slot >= 0)
        lastUse[a.slot] = static_cast<int>(i);
      for (const auto &[name, slot] : a.listValues)
        lastUse[slot] = static_cast<int>(i);
    }
  }
  std::vector<bool> kept(slots_, false);
  for (const Port &p : inputs_)
    kept[p.slot] = true;
  for (const Port &p : outputs_)
    if (p.slot >= 0)
      kept[p.slot] = true;
  for (size_t s = 0; s < slots_; ++s)
    if (!kept[s] && madeAt[s] >= 0)
      steps_[std::max(lastUse[s], madeAt[s])].release.push_back(static_cast<int>(s));
  // A gradient is complete after the last step that reads or writes any alias of it.
  std::map<int, int> groupEnd;
  for (size_t s = 0; s < slots_; ++s)
    groupEnd[root_[s]] =
        std::max({groupEnd.count(root_[s]) ? groupEnd[root_[s]] : -1, lastUse[s], madeAt[s]});
  for (size_t i = 0; i < outputs_.size(); ++i)
    if (graph_.outputs[i].kind == "gradient" && outputs_[i].slot >= 0) {
      const int end = groupEnd[root_[outputs_[i].slot]];
      steps_.at(end >= 0 ? end : steps_.size() - 1).ready.push_back(i);
    }
  return Status::ok();
}

Status JointProgram::placeLaunches(const std::vector<Launch> &launches) {
  std::map<std::string, size_t> stepOf, completeAt;
  for (size_t i = 0; i < steps_.size(); ++i) {
    stepOf[steps_[i].name] = i;
    for (size_t out : steps_[i].ready)
      completeAt[outputs_[out].name] = i;
    steps_[i].ready.clear();
  }
  std::map<std::string, size_t> gradient;
  for (size_t i = 0; i < outputs_.size(); ++i)
    if (graph_.outputs[i].kind == "gradient" && outputs_[i].slot >= 0)
      gradient[outputs_[i].name] = i;
  size_t handed = 0;
  for (const Launch &launch : launches) {
    auto at = stepOf.find(launch.after);
    if (at == stepOf.end())
      return Status::error("the plan reduces gradients after value '" + launch.after +
                           "', which no node of the joint graph makes");
    for (const std::string &parameter : launch.parameters) {
      auto out = gradient.find(parameter);
      if (out == gradient.end())
        return Status::error("the plan reduces the gradient of '" + parameter +
                             "', which the joint graph does not compute");
      if (completeAt.at(parameter) > at->second)
        return Status::error("the plan reduces the gradient of '" + parameter + "' after node " +
                             launch.after + ", but node " + steps_[completeAt.at(parameter)].name +
                             " still reads or writes it; compile the plan again");
      steps_[at->second].ready.push_back(out->second);
      ++handed;
    }
  }
  if (handed != gradient.size())
    return Status::error("the plan reduces " + std::to_string(handed) + " of the " +
                         std::to_string(gradient.size()) + " gradients its joint graph computes");
  return Status::ok();
}

c10::IValue JointProgram::call(const Step &step, std::vector<c10::IValue> &table) const {
  if (!step.op) {
    const c10::IValue &from = table[step.args[0].slot];
    const int64_t i = step.item;
    if (from.isTuple() && i >= 0 && i < static_cast<int64_t>(from.toTupleRef().elements().size()))
      return from.toTupleRef().elements()[i];
    if (from.isList() && i >= 0 && i < static_cast<int64_t>(from.toListRef().size()))
      return from.toListRef()[i];
    throw std::runtime_error("item " + std::to_string(i) + " of a value that has none");
  }
  std::vector<c10::IValue> stack;
  stack.reserve(step.args.size());
  for (const Arg &a : step.args) {
    if (a.slot >= 0) {
      stack.push_back(table[a.slot]);
    } else if (a.list) {
      std::map<std::string, c10::IValue> values;
      for (const auto &[name, slot] : a.listValues)
        values[name] = table[slot];
      auto decoded = decodeArgument(*a.list, a.type, values);
      if (!decoded)
        throw std::runtime_error(decoded.status().message());
      stack.push_back(decoded.take());
    } else {
      stack.push_back(a.constant);
    }
  }
  step.op->callBoxed(stack);
  if (step.returns == 1)
    return std::move(stack.at(0));
  if (step.returns == 0)
    return c10::IValue();
  return c10::IValue(c10::ivalue::Tuple::create(std::move(stack)));
}

Expected<std::vector<c10::IValue>>
JointProgram::run(const std::map<std::string, at::Tensor> &inputs,
                  const GradientReady &ready) const {
  const std::string where = "phase '" + graph_.phase + "'";
  std::vector<c10::IValue> table(slots_);
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const JointPort &port = graph_.inputs[i];
    const auto &from = port.kind == "constant" ? graph_.constants : inputs;
    auto found = from.find(port.name);
    if (found == from.end())
      return Status::error(where + ": no tensor for its " + port.kind + " '" + port.name + "'");
    if (!port.shape.empty() && found->second.sizes() != c10::IntArrayRef(port.shape))
      return Status::error(where + ": its joint graph was captured with " + port.kind + " '" +
                           port.name + "' of shape " + shapeText(port.shape) + "; this run gives " +
                           shapeText(found->second.sizes()));
    table[inputs_[i].slot] = found->second;
  }
  at::NoGradGuard noGrad;
  for (const Step &step : steps_) {
    try {
      table[step.out] = call(step, table);
    } catch (const std::exception &e) {
      const std::string what = e.what();
      return Status::failure(where + ", node " + step.name + ": " +
                             what.substr(0, what.find('\n')));
    }
    for (int slot : step.release)
      table[slot] = c10::IValue();
    if (ready)
      for (size_t out : step.ready)
        ready(outputs_[out].name, table[outputs_[out].slot].toTensor());
  }
  std::vector<c10::IValue> outputs;
  outputs.reserve(outputs_.size());
  for (const Port &port : outputs_)
    outputs.push_back(port.slot >= 0 ? table[port.slot] : port.constant);
  return outputs;
}

} // namespace ganc::backend
