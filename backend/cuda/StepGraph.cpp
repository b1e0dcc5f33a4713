// A step's phase graphs as child graphs of one executable graph (see StepGraph.h).
#include "backend/cuda/StepGraph.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace ganc::backend {

std::unique_ptr<StepGraph> StepGraph::build(const std::vector<PhaseGraph *> &phases,
                                            c10::Device device, std::string &error) {
  cudaGraph_t graph = nullptr;
  cudaError_t status = cudaGraphCreate(&graph, 0);
  cudaGraphNode_t previous = nullptr;
  for (size_t i = 0; status == cudaSuccess && i < phases.size(); ++i) {
    cudaGraphNode_t node = nullptr;
    status = cudaGraphAddChildGraphNode(&node, graph, previous ? &previous : nullptr,
                                        previous ? 1 : 0, phases[i]->raw_cuda_graph());
    previous = node;
  }
  cudaGraphExec_t exec = nullptr;
  if (status == cudaSuccess)
    status = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  if (graph)
    (void)cudaGraphDestroy(graph); // the executable does not need it
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    error = cudaGetErrorString(status);
    return nullptr;
  }
  auto step = std::unique_ptr<StepGraph>(new StepGraph());
  step->phases_ = phases;
  step->device_ = device;
  step->exec_ = exec;
  return step;
}

StepGraph::~StepGraph() {
  if (exec_)
    (void)cudaGraphExecDestroy(exec_);
}

void StepGraph::launch(RngOnDevice &rng) {
  c10::OptionalDeviceGuard deviceGuard{device_};
  for (PhaseGraph *phase : phases_)
    phase->advanceGenerators(rng);
  C10_CUDA_CHECK(cudaGraphLaunch(exec_, at::cuda::getCurrentCUDAStream()));
}

} // namespace ganc::backend
