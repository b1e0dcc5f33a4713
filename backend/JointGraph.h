// A phase's joint graph (forward, its autograd.grad calls and the parameter gradients as one
// list of ATen ops, written by ganc.joint) and the executor that runs it through the
// dispatcher: no autograd engine, no TorchScript interpreter.
#pragma once

#include "support/Status.h"

#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace ganc::backend {

/// One of the graph's inputs or outputs: its value's name in the op list, its kind
/// (parameter, buffer, input, constant in; loss, gradient, buffer out) and the name it has
/// outside the graph (the parameter's, the phase input's).
struct JointPort {
  std::string value;
  std::string kind;
  std::string name;
  nlohmann::json encoded; ///< an output's value as the op list writes it (a name or a constant)
};

/// A captured phase, as ganc.joint.to_file writes it (docs/ir.md, "Joint graphs").
struct JointGraph {
  std::string phase;
  std::string method;
  std::vector<JointPort> inputs;
  std::vector<JointPort> outputs;
  nlohmann::json nodes;
  std::map<std::string, at::Tensor> constants;

  /// The parameters the graph computes a gradient for: the phase's used parameters.
  std::vector<std::string> used() const;
};

/// The value a torch.save file holds, its zip checked first; an error names `what` and `path`.
Expected<c10::IValue> readTorchSave(const std::string &path, const std::string &what);

/// Reads the op list at `path`; an error names the file and what is wrong with it.
Expected<JointGraph> readJointGraph(const std::string &path);

/// Runs `graph` on `inputs` (by JointPort::name, for the parameter, buffer and input ports;
/// the constants come with the graph), op by op through the dispatcher. In-place ops change
/// the tensors given (a buffer updated in the phase is updated here). Returns the outputs in
/// the graph's order. An op the dispatcher does not know, or an argument its schema does not
/// take, is an error naming the node.
Expected<std::vector<c10::IValue>> runJointGraph(const JointGraph &graph,
                                                 const std::map<std::string, at::Tensor> &inputs);

} // namespace ganc::backend
