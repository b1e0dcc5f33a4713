// `ganc joint`: its options, and the run of one captured phase on tensors from a file.
#include "tools/JointCommand.h"

#include "backend/JointProgram.h"
#include "support/Files.h"

#include <torch/serialize.h>

#include <iostream>

namespace ganc::tools {

namespace {

struct JointArgs {
  std::string graph;
  std::string inputs;
  std::string out;
  bool help = false;
};

const Command<JointArgs> &jointTable() {
  using S = const std::string;
  using J = JointArgs;
  static const Command<JointArgs> command = {
      {"ganc joint",
       {"GRAPH.pt [--inputs TENSORS.pt -o OUT.pt]"},
       "Reads one phase's joint graph (its forward, its autograd.grad calls and its parameter "
       "gradients as one list of ATen ops, written by ganc.joint.to_file) and says what it "
       "computes: its ops and the parameters it gives a gradient, the phase's used "
       "parameters. With --inputs, runs it through the dispatcher (no autograd engine, no "
       "TorchScript) on the parameters, buffers and phase inputs of a torch.save dict, and "
       "writes the loss, each gradient (`gradient:NAME`) and each buffer (`buffer:NAME`) to "
       "OUT.pt.",
       {},
       ""},
      {{"--inputs", "TENSORS.pt",
        "a torch.save dict of tensors by name: every parameter, buffer and phase input",
        [](S &, S &v, J &j) { j.inputs = v; }},
       {"-o", "OUT.pt", "where the outputs go (a torch.save dict; with --inputs)",
        [](S &, S &v, J &j) { j.out = v; }}},
      [](const std::string &argument, JointArgs &j) {
        if (!j.graph.empty())
          throw OptionError("unexpected argument '" + argument + "'");
        j.graph = argument;
      }};
  return command;
}

Expected<std::map<std::string, at::Tensor>> readTensors(const std::string &path) {
  auto read = readTorchSave(path, "--inputs");
  if (!read)
    return read.status();
  const c10::IValue value = read.take();
  if (!value.isGenericDict())
    return Status::error("--inputs " + path + ": not a dict of tensors by name");
  std::map<std::string, at::Tensor> tensors;
  for (const auto &entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor())
      return Status::error("--inputs " + path + ": not a dict of tensors by name");
    tensors[entry.key().toStringRef()] = entry.value().toTensor();
  }
  return tensors;
}

Status runJoint(const JointArgs &j) {
  auto graph = readJointGraph(j.graph);
  if (!graph)
    return graph.status();
  const std::vector<std::string> used = graph->used();
  std::cout << "phase " << graph->phase << " (" << graph->method << "): " << graph->nodes.size()
            << " ATen ops, gradients for " << used.size() << " parameters" << std::endl;
  for (const std::string &name : used)
    std::cout << "  used " << name << std::endl;
  if (j.inputs.empty())
    return Status::ok();
  if (j.out.empty())
    return Status::error("joint: --inputs needs -o OUT.pt");
  auto inputs = readTensors(j.inputs);
  if (!inputs)
    return inputs.status();
  // The loss's gradient seed, unless given: 1 (autograd.grad's default).
  for (const JointPort &port : graph->inputs)
    if (port.kind == "seed" && !inputs->count(port.name)) {
      auto dtype = scalarTypeNamed(port.dtype.empty() ? "float32" : port.dtype);
      if (!dtype)
        return dtype.status().withContext(j.graph);
      (*inputs)[port.name] = at::ones({}, at::TensorOptions(*dtype));
    }
  auto program = backend::JointProgram::compile(graph.take());
  if (!program)
    return program.status().withContext(j.graph);
  auto outputs = (*program)->run(*inputs, nullptr);
  if (!outputs)
    return outputs.status();
  const JointGraph &ran = (*program)->graph();
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (size_t i = 0; i < outputs->size(); ++i) {
    const JointPort &port = ran.outputs[i];
    dict.insert(port.kind == "loss" ? port.kind : port.kind + ":" + port.name, (*outputs)[i]);
  }
  return writeFileAtomically(j.out, torch::pickle_save(dict));
}

} // namespace

CommandDoc jointCommandDoc() { return jointTable().documented(); }

int jointCommand(const std::vector<std::string> &args) {
  JointArgs j;
  if (Status s = jointTable().parse(args, j, j.help); !s) {
    std::cerr << "ganc: error: joint: " << s.message() << std::endl;
    return 2;
  }
  if (j.help) {
    std::cout << jointCommandDoc().usage();
    return 0;
  }
  if (j.graph.empty()) {
    std::cerr << "ganc: error: joint: usage: ganc joint GRAPH.pt [--inputs TENSORS.pt -o OUT.pt]"
              << std::endl;
    return 2;
  }
  Status status = runJoint(j);
  if (!status)
    std::cerr << "ganc: error: " << status.message() << std::endl;
  return status.exitCode();
}

} // namespace ganc::tools
