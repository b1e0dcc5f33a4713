// A step's phases as one executable graph (--cuda-graphs step).
#pragma once

#include "backend/cuda/PhaseGraph.h"

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

namespace ganc::backend {

/// A step's phases as one executable graph: each phase's captured graph a child node,
/// chained in the step's order, so one launch runs the step (the phases' RNG offsets advance
/// on the device from child to child). Built once per sequence of phases.
class StepGraph {
public:
  /// Null, with the runtime's reason in `error`, where the graph cannot be built.
  static std::unique_ptr<StepGraph> build(const std::vector<PhaseGraph *> &phases,
                                          c10::Device device, std::string &error);
  ~StepGraph();
  StepGraph(const StepGraph &) = delete;
  StepGraph &operator=(const StepGraph &) = delete;

  /// The step's one launch on the current stream (the host side of every phase first).
  void launch(RngOnDevice &rng);

private:
  StepGraph() = default;
  std::vector<PhaseGraph *> phases_;
  c10::Device device_ = c10::kCUDA;
  cudaGraphExec_t exec_ = nullptr;
};

} // namespace ganc::backend
