// Sections in the IR: the joined graph of a phase that takes values through their graph.
#include "frontend/Sections.h"

#include <torch/csrc/jit/ir/constants.h>

#include <optional>

namespace ganc::frontend {

namespace jit = torch::jit;

Expected<std::shared_ptr<jit::Graph>> throughGraph(Archive &archive, PhaseSpec &phase) {
  std::shared_ptr<jit::Graph> own = archive.module.get_method(phase.method).graph();
  auto graph = std::make_shared<jit::Graph>();
  jit::Value *self = graph->addInput("self")->setType(own->inputs()[0]->type());
  std::vector<InputSpec> inputs;
  std::vector<jit::Value *> args = {self};
  for (size_t i = 0; i < phase.inputs.size(); ++i) {
    const InputSpec &in = phase.inputs[i];
    const bool taken = in.source == InputSource::Output && !in.detach;
    args.push_back(taken ? nullptr
                         : graph->addInput(in.name)->setType(own->inputs()[i + 1]->type()));
    if (!taken)
      inputs.push_back(in);
  }
  for (const std::string &name : phase.throughSections()) {
    const PhaseSpec &section = *archive.spec.findPhase(name);
    std::shared_ptr<jit::Graph> body = archive.module.get_method(section.method).graph();
    std::vector<jit::Value *> sectionArgs = {self};
    for (size_t i = 0; i < section.inputs.size(); ++i) {
      InputSpec in = section.inputs[i];
      in.name = name + "_" + in.name;
      sectionArgs.push_back(graph->addInput(in.name)->setType(body->inputs()[i + 1]->type()));
      inputs.push_back(in);
    }
    std::vector<jit::Value *> outputs = jit::insertGraph(*graph, *body, sectionArgs);
    if (outputs.size() != 1 || outputs[0]->type()->kind() != c10::TypeKind::DictType)
      return Status::error("section '" + name + "': method '" + section.method +
                           "' must return a dict of its outputs");
    for (size_t i = 0; i < phase.inputs.size(); ++i)
      if (!args[i + 1] && phase.inputs[i].producer == name)
        args[i + 1] = graph->insert(c10::aten::__getitem__,
                                    {outputs[0], graph->insertConstant(phase.inputs[i].value)});
  }
  for (jit::Value *out : jit::insertGraph(*graph, *own, args))
    graph->registerOutput(out);
  phase.inputs = inputs;
  return graph;
}

Status foldDictReads(jit::Graph &graph) {
  for (jit::Node *node : graph.block()->nodes()) {
    if (node->kind() != c10::aten::__getitem__ || node->inputs().size() != 2 ||
        node->input(0)->node()->kind() != c10::prim::DictConstruct)
      continue;
    const std::optional<c10::IValue> key = jit::toIValue(node->input(1));
    jit::Node *dict = node->input(0)->node();
    for (size_t i = 0; key && key->isString() && i + 1 < dict->inputs().size(); i += 2) {
      const std::optional<c10::IValue> k = jit::toIValue(dict->input(i));
      if (k && k->isString() && k->toStringRef() == key->toStringRef())
        node->output()->replaceAllUsesWith(dict->input(i + 1));
    }
    if (node->output()->hasUses())
      return Status::error("a section must return its outputs as a dict literal "
                           "({\"name\": tensor, ...}): ganc could not follow '" +
                           (key && key->isString() ? key->toStringRef() : std::string("?")) +
                           "' into it");
  }
  return Status::ok();
}

} // namespace ganc::frontend
