// A phase's joint graph (forward, its autograd.grad calls and the parameter gradients as one
// list of ATen ops, written by ganc.joint), as read from its file or an archive; JointProgram
// runs it through the dispatcher: no autograd engine, no TorchScript interpreter.
#pragma once

#include "support/Status.h"

#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace ganc {

/// One of the graph's inputs or outputs: its value's name in the op list, its kind
/// (parameter, buffer, input, constant in; loss, gradient, buffer out) and the name it has
/// outside the graph (the parameter's, the phase input's).
struct JointPort {
  std::string value;
  std::string kind;
  std::string name;
  nlohmann::json encoded; ///< an output's value as the op list writes it (a name or a constant)
  /// An input's shape and dtype at capture ("float32"); empty where the op list gives none.
  std::vector<int64_t> shape;
  std::string dtype;
};

/// A captured phase, as ganc.joint.to_file writes it (docs/ir.md, "Joint graphs").
struct JointGraph {
  std::string phase;
  std::string method;
  std::vector<JointPort> inputs;
  std::vector<JointPort> outputs;
  nlohmann::json nodes;
  std::map<std::string, at::Tensor> constants;

  /// The autocast precision the phase was captured under ("float32", "bfloat16", "float16"),
  /// or "" where the op list does not say (written before it did).
  std::string precision;
  /// The batch the phase was captured for (its inputs' first dimension), or 0 where the op
  /// list does not say.
  int64_t batch = 0;
  /// The grouped convolutions the capture ran as ganc::convolution (ganc's double backward of
  /// filters that take no gradient, ganc.joint.GroupedConvolutions); -1 where the op list does
  /// not say (captured with PyTorch's double backward).
  int64_t groupedConvolutions = -1;

  /// The parameters the graph computes a gradient for: the phase's used parameters.
  std::vector<std::string> used() const;
  /// The dtype of the loss the graph computes ("float16" under float16 autocast), as the op
  /// list records its result; "" where it does not.
  std::string lossDtype() const;
};

/// An op-list argument (docs/ir.md, "Joint graphs") as the IValue the schema's `type` takes,
/// its value references ({"value": name}) looked up in `values`.
Expected<c10::IValue> decodeArgument(const nlohmann::json &j, const c10::TypePtr &type,
                                     const std::map<std::string, c10::IValue> &values);

/// The names of the values an op-list argument holds ({"value": NAME}, in lists too), in order,
/// appended to `names`.
void valuesIn(const nlohmann::json &argument, std::vector<std::string> &names);

/// The dtype an op list names ("float32", "bfloat16", ...).
Expected<c10::ScalarType> scalarTypeNamed(const std::string &name);

/// The value a torch.save file holds, its zip checked first; an error names `what` and `path`.
Expected<c10::IValue> readTorchSave(const std::string &path, const std::string &what);

/// The op list and constants `stored` holds (a dict {"graph": op list text, "constants":
/// {name: tensor}}, as ganc.joint stores one); errors name `where`.
Expected<JointGraph> jointGraphOf(const c10::IValue &stored, const std::string &where);

/// Reads the op list at `path`; an error names the file and what is wrong with it.
Expected<JointGraph> readJointGraph(const std::string &path);

/// The joint graph a torch.save file's `bytes` hold (an archive's entry); errors name `where`.
Expected<JointGraph> jointGraphFromBytes(const std::vector<char> &bytes, const std::string &where);

} // namespace ganc
