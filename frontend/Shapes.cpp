// Shape probing: one run of a phase's graph on example inputs records every tensor's type.
#include "frontend/Shapes.h"

#include "support/torch/Dtypes.h"
#include "support/torch/TorchError.h"

#include <torch/csrc/jit/runtime/interpreter.h>

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
  if (input.source == InputSource::Fade)
    return torch::rand({}).to(inputScalarType(spec));
  if (input.isClassIds())
    return torch::randint(input.classes, {batch}, torch::kLong);
  std::vector<int64_t> shape = {batch};
  const auto &sample = input.source == InputSource::Data ? spec.dataShape : input.shape;
  shape.insert(shape.end(), sample.begin(), sample.end());
  return (input.source == InputSource::Uniform ? torch::rand(shape) : torch::randn(shape))
      .to(inputScalarType(spec));
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
    at::Tensor example = exampleInput(archive.spec, phase.inputs[i], archive.spec.batchSize);
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
    // (loss, {name: scalar}): the values a phase logs besides its loss.
    const auto &elements = loss.toTupleRef().elements();
    bool logged = elements.size() == 2 && elements[1].isGenericDict();
    if (logged)
      for (const auto &entry : elements[1].toGenericDict())
        logged = logged && entry.value().isTensor() && entry.value().toTensor().numel() == 1;
    if (!logged)
      return Status::error("method '" + phase.method +
                           "' returns a tuple: it must be (loss, "
                           "{name: scalar tensor, ...})");
    loss = elements[0];
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
