// Shape probing: one run of a phase's graph on example inputs records every tensor's type.
#include "frontend/Shapes.h"

#include "support/torch/Dtypes.h"
#include "support/torch/TorchError.h"

#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <algorithm>

namespace ganc::frontend {

c10::ScalarType inputScalarType(const Spec &spec) {
  switch (spec.inputDtype) {
  case InputDtype::Float64:
    return c10::kDouble;
  case InputDtype::BFloat16:
    return c10::kBFloat16;
  case InputDtype::Float16:
    return c10::kHalf;
  case InputDtype::Float32:
    break;
  }
  return c10::kFloat;
}

namespace jit = torch::jit;

at::Tensor exampleInput(const Spec &spec, const InputSpec &input, int64_t batch) {
  if (input.source == InputSource::Controller)
    return torch::full({}, spec.controllers.at(input.controller).initial).to(inputScalarType(spec));
  if (input.source == InputSource::Fade)
    return torch::rand({}).to(inputScalarType(spec));
  if (input.isClassIds())
    return torch::randint(input.classes, {batch}, torch::kLong);
  std::vector<int64_t> shape = {batch};
  const auto &sample = input.source == InputSource::Data ? spec.sampleShape(input) : input.shape;
  shape.insert(shape.end(), sample.begin(), sample.end());
  return (input.source == InputSource::Uniform ? torch::rand(shape) : torch::randn(shape))
      .to(inputScalarType(spec));
}

Expected<c10::impl::GenericDict> returnedValues(const c10::IValue &output,
                                                const std::string &method) {
  if (output.isGenericDict())
    return output.toGenericDict();
  if (output.isTuple() && output.toTupleRef().elements().size() == 2 &&
      output.toTupleRef().elements()[1].isGenericDict())
    return output.toTupleRef().elements()[1].toGenericDict();
  if (output.isTensor())
    return c10::impl::GenericDict(c10::StringType::get(), c10::TensorType::get());
  return Status::error("method '" + method +
                       "' must return a loss, (loss, {name: tensor}) or, for a section, "
                       "{name: tensor}");
}

namespace {

/// Checks the dict a method returned: each of `outputs` a tensor, every other key a scalar
/// (a logged value).
Status checkValues(const c10::impl::GenericDict &values, const PhaseSpec &phase) {
  for (const std::string &name : phase.outputs) {
    auto it = values.find(name);
    if (it == values.end() || !it->value().isTensor())
      return Status::error("method '" + phase.method + "' returns no tensor '" + name +
                           "', one of the phase's 'outputs'");
  }
  for (const auto &entry : values) {
    const std::string &key = entry.key().toStringRef();
    const bool output = std::count(phase.outputs.begin(), phase.outputs.end(), key) > 0;
    if (!output && (!entry.value().isTensor() || entry.value().toTensor().numel() != 1))
      return Status::error("method '" + phase.method + "' returns '" + key +
                           "', which is neither one of the phase's 'outputs' nor a scalar "
                           "to log");
  }
  return Status::ok();
}

/// Whether the method (with what it calls) takes a gradient: torch.autograd.grad or backward.
bool differentiates(const std::shared_ptr<jit::Graph> &graph) {
  auto inlined = graph->copy();
  jit::Inline(*inlined);
  std::vector<jit::Block *> blocks = {inlined->block()};
  while (!blocks.empty()) {
    jit::Block *block = blocks.back();
    blocks.pop_back();
    for (jit::Node *n : block->nodes()) {
      if (n->kind() == c10::aten::grad || n->kind() == c10::aten::backward)
        return true;
      for (jit::Block *inner : n->blocks())
        blocks.push_back(inner);
    }
  }
  return false;
}

/// The phase's method run once on example inputs (values taken from earlier phases as they
/// compute them), without recording gradients unless it differentiates.
Expected<c10::IValue> runOnExamples(Archive &archive, const PhaseSpec &phase) {
  std::vector<c10::IValue> args;
  for (const InputSpec &in : phase.inputs) {
    if (in.source != InputSource::Output) {
      args.emplace_back(exampleInput(archive.spec, in, archive.spec.batchSize));
      continue;
    }
    auto taken = exampleOutput(archive, in);
    if (!taken)
      return taken.status();
    args.emplace_back(taken.take());
  }
  // Without gradients, unless the method differentiates (a gradient penalty beside the values
  // it hands on: its autograd.grad needs the graph).
  c10::AutoGradMode gradients(differentiates(archive.module.get_method(phase.method).graph()));
  try {
    return archive.module.get_method(phase.method)(args);
  } catch (const std::exception &e) {
    return Status::error("running method '" + phase.method +
                         "' on example inputs failed: " + firstLine(e))
        .inPhase(phase.name);
  }
}

} // namespace

Expected<at::Tensor> exampleOutput(Archive &archive, const InputSpec &input) {
  const PhaseSpec *producer = archive.spec.findPhase(input.producer);
  if (!producer)
    return Status::error("no phase '" + input.producer + "'");
  auto output = runOnExamples(archive, *producer);
  if (!output)
    return output.status();
  auto values = returnedValues(*output, producer->method);
  if (!values)
    return values.status().inPhase(producer->name);
  GANC_TRY(checkValues(*values, *producer).inPhase(producer->name));
  return values->at(input.value).toTensor().detach();
}

namespace {

/// `phase`'s method logs controller `c`'s statistic, a scalar.
/// Whether ganc's own archive's joint graphs of `phase` (every stage's) log `statistic`.
bool jointGraphsLog(const Archive &archive, const PhaseSpec &phase, const std::string &statistic) {
  bool any = false;
  for (const auto &[key, graph] : archive.jointGraphs) {
    if (key != phase.name && key.rfind(phase.name + "@", 0) != 0)
      continue;
    any = true;
    if (std::none_of(graph.outputs.begin(), graph.outputs.end(), [&](const JointPort &port) {
          return port.kind == "stat" && port.name == statistic;
        }))
      return false;
  }
  return any;
}

Status checkLogged(Archive &archive, const std::string &controller, const ControllerSpec &c,
                   const PhaseSpec &phase) {
  if (!archive.torchscript) {
    if (jointGraphsLog(archive, phase, c.statistic))
      return Status::ok();
    return Status::error("controller '" + controller + "' reads '" + c.statistic +
                         "', which method '" + phase.method + "' does not log (return (loss, {\"" +
                         c.statistic + "\": scalar tensor, ...}))")
        .inPhase(phase.name);
  }
  auto output = runOnExamples(archive, phase);
  if (!output)
    return output.status();
  auto values = returnedValues(*output, phase.method);
  if (!values)
    return values.status().inPhase(phase.name);
  auto it = values->find(c.statistic);
  if (it == values->end() || !it->value().isTensor() || it->value().toTensor().numel() != 1)
    return Status::error("controller '" + controller + "' reads '" + c.statistic +
                         "', which method '" + phase.method + "' does not log (return (loss, {\"" +
                         c.statistic + "\": scalar tensor, ...}))")
        .inPhase(phase.name);
  return Status::ok();
}

} // namespace

Status checkControllersLogged(Archive &archive) {
  for (const auto &[controller, c] : archive.spec.controllers)
    for (const std::string &name : c.phases)
      GANC_TRY(checkLogged(archive, controller, c, *archive.spec.findPhase(name)));
  return Status::ok();
}

Status checkSection(Archive &archive, const PhaseSpec &section) {
  auto output = runOnExamples(archive, section);
  if (!output)
    return output.status();
  if (!output->isGenericDict())
    return Status::error("method '" + section.method + "' must return a dict of its outputs ({'" +
                         section.outputs[0] +
                         "': tensor, ...}): the phase is a section (it has no 'updates')")
        .inPhase(section.name);
  return checkValues(output->toGenericDict(), section).inPhase(section.name);
}

Expected<std::map<jit::Value *, ir::Type>> probeShapes(Archive &archive, const PhaseSpec &phase,
                                                       const std::shared_ptr<jit::Graph> &graph) {
  std::map<jit::Value *, ir::Type> shapes;
  // The interpreter compiles its own copy of the graph, so the extra outputs registered
  // here are removed again right after and the lowered graph is left as it was.
  size_t originalOutputs = graph->outputs().size();
  std::vector<jit::Value *> probed;
  for (jit::Node *node : graph->nodes())
    for (jit::Value *v : node->outputs())
      if (v->type()->kind() == c10::TypeKind::TensorType) {
        graph->registerOutput(v);
        probed.push_back(v);
      }
  jit::Stack stack;
  stack.emplace_back(archive.module._ivalue());
  for (size_t i = 0; i < phase.inputs.size(); ++i) {
    at::Tensor example;
    if (phase.inputs[i].source == InputSource::Output) {
      auto taken = exampleOutput(archive, phase.inputs[i]);
      if (!taken)
        return taken.status();
      example = taken.take();
    } else {
      example = exampleInput(archive.spec, phase.inputs[i], archive.spec.batchSize);
    }
    stack.emplace_back(example);
    shapes[graph->inputs()[i + 1]] =
        ir::Type::tensor(dtypeName(example.scalar_type()), example.sizes().vec());
  }
  std::string failure;
  try {
    jit::Code code(graph, phase.method);
    jit::InterpreterState(code).run(stack);
  } catch (const std::exception &e) {
    failure = firstLine(e);
  }
  while (graph->outputs().size() > originalOutputs)
    graph->eraseOutput(graph->outputs().size() - 1);
  if (!failure.empty())
    return Status::error("running method '" + phase.method +
                         "' on example inputs failed: " + failure);
  if (stack.size() != originalOutputs + probed.size())
    return Status::error("unexpected interpreter result");
  c10::IValue loss = stack[0];
  if (originalOutputs == 1 && loss.isTuple()) {
    // (loss, {name: value}): the values it hands on (its outputs) and logs besides its loss.
    const auto &elements = loss.toTupleRef().elements();
    if (elements.size() != 2 || !elements[1].isGenericDict())
      return Status::error("method '" + phase.method +
                           "' returns a tuple: it must be (loss, "
                           "{name: scalar tensor, ...})");
    GANC_TRY(checkValues(elements[1].toGenericDict(), phase));
    loss = elements[0];
  } else if (!phase.outputs.empty()) {
    return Status::error("method '" + phase.method +
                         "' must return (loss, {name: tensor}) "
                         "holding its 'outputs'");
  }
  if (originalOutputs != 1 || !loss.isTensor())
    return Status::error("method '" + phase.method + "' must return one scalar loss tensor");
  if (loss.toTensor().dim() != 0)
    return Status::error("method '" + phase.method + "' returns a tensor of shape " +
                         c10::str(loss.toTensor().sizes()) + ", not a scalar loss");
  for (size_t i = 0; i < probed.size(); ++i) {
    const c10::IValue &value = stack[originalOutputs + i];
    if (!value.isTensor())
      continue;
    const at::Tensor &t = value.toTensor();
    shapes[probed[i]] = ir::Type::tensor(dtypeName(t.scalar_type()), t.sizes().vec());
  }
  return shapes;
}

} // namespace ganc::frontend
