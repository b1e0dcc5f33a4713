// The fill kernel behind the memset-to-kernel pass (see CudaGraphExecutor's PhaseGraph).
#include "backend/FillPlan.h"
#include "backend/cuda/FillKernel.h"

#include <algorithm>
#include <cstdint>

namespace ganc::backend {

namespace {

/// Writes `value` into `width` elements of each of `height` rows `pitch` bytes apart.
template <typename T>
__global__ void fillRows(char *dst, size_t pitch, T value, size_t width, size_t height) {
  const size_t n = width * height;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t row = i / width;
    reinterpret_cast<T *>(dst + row * pitch)[i - row * width] = value;
  }
}

template <typename T>
cudaError_t addNode(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *dependencies,
                    size_t count, char *dst, const FillPlan &plan) {
  constexpr unsigned kThreads = 256;
  size_t pitch = plan.pitch, width = plan.width, height = plan.height;
  T value = static_cast<T>(plan.word);
  const size_t blocks = std::min<size_t>((width * height + kThreads - 1) / kThreads, 1024);
  // cudaGraphAddKernelNode copies the argument values: these locals need only outlive it.
  void *args[] = {&dst, &pitch, &value, &width, &height};
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void *>(&fillRows<T>);
  params.gridDim = dim3(static_cast<unsigned>(blocks));
  params.blockDim = dim3(kThreads);
  params.sharedMemBytes = 0;
  params.kernelParams = args;
  params.extra = nullptr;
  return cudaGraphAddKernelNode(node, graph, dependencies, count, &params);
}

} // namespace

cudaError_t addFillKernelNode(cudaGraphNode_t *node, cudaGraph_t graph,
                              const cudaGraphNode_t *dependencies, size_t count,
                              const cudaMemsetParams &memset) {
  const std::optional<FillPlan> plan =
      planFill(reinterpret_cast<uintptr_t>(memset.dst), memset.pitch, memset.value,
               memset.elementSize, memset.width, memset.height);
  if (!plan)
    return cudaErrorNotSupported;
  char *dst = static_cast<char *>(memset.dst);
  switch (plan->wordBytes) {
  case 4:
    return addNode<uint32_t>(node, graph, dependencies, count, dst, *plan);
  case 2:
    return addNode<uint16_t>(node, graph, dependencies, count, dst, *plan);
  default:
    return addNode<uint8_t>(node, graph, dependencies, count, dst, *plan);
  }
}

} // namespace ganc::backend
