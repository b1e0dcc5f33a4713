// A phase's joint graph prepared to run every step: each operator found in the dispatcher
// once, each constant argument decoded once, values in a table of slots, each value let go
// after its last use, and each parameter gradient handed on as soon as the op that completes
// it has run (so its bucket's all-reduce can start while the rest of the graph runs).
#pragma once

#include "support/torch/JointGraph.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ganc::backend {

class JointProgram {
public:
  /// Where a plan hands gradients on: after the node making value `after`, the gradients of
  /// `parameters` (a bucket's, whose collective the plan placed there).
  struct Launch {
    std::string after;
    std::vector<std::string> parameters;
  };

  /// Prepares `graph`; an operator the dispatcher does not know, or an argument of no form
  /// its schema takes, is an error naming the node. Without `launches` each gradient is handed
  /// on after the last node touching it; with them, where they say, and a launch before a
  /// gradient is complete (a node after it still reads or writes it) is an error.
  static Expected<std::shared_ptr<const JointProgram>>
  compile(JointGraph graph, const std::optional<std::vector<Launch>> &launches = std::nullopt);

  /// Called with each parameter gradient the graph computes, once no later op reads or
  /// changes it (nor any view of it).
  using GradientReady = std::function<void(const std::string &parameter, const at::Tensor &)>;

  /// Runs the graph on `inputs` (by port name: parameters, buffers, phase inputs, the seed),
  /// in-place ops changing the tensors given (buffers updated in the phase are updated here).
  /// Returns the outputs in the graph's order. An op's failure is an error naming the node.
  Expected<std::vector<c10::IValue>> run(const std::map<std::string, at::Tensor> &inputs,
                                         const GradientReady &ready) const;

  const JointGraph &graph() const { return graph_; }

private:
  /// An argument: a value of the table, a constant decoded once, or a list holding values
  /// (decoded at each run from the values it names).
  struct Arg {
    int slot = -1;
    c10::IValue constant;
    const nlohmann::json *list = nullptr;
    std::vector<std::pair<std::string, int>> listValues;
    c10::TypePtr type;
  };
  struct Step {
    std::string name;
    std::optional<c10::OperatorHandle> op; // none: getitem
    std::vector<Arg> args;
    int64_t item = -1;
    size_t returns = 1;
    int out = -1;
    std::vector<int> release;  // slots last used here
    std::vector<size_t> ready; // gradient outputs complete after this step
  };
  struct Port {
    std::string name;
    int slot = -1;
    c10::IValue constant; // an output the graph gives as a constant
  };

  Status prepareStep(const nlohmann::json &node, std::map<std::string, int> &slotOf);
  static Expected<Arg> prepareArgument(const c10::Argument &arg, const nlohmann::json *given,
                                       const std::map<std::string, int> &slotOf);
  Status planLifetimes();
  Status placeLaunches(const std::vector<Launch> &launches);
  c10::IValue call(const Step &step, std::vector<c10::IValue> &table) const;

  JointGraph graph_;
  std::vector<Step> steps_;
  std::vector<Port> inputs_, outputs_;
  /// Each slot's alias root: a view or an in-place op's result shares its input's.
  std::vector<int> root_;
  size_t slots_ = 0;
};

} // namespace ganc::backend
