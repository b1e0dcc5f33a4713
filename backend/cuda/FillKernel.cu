// The fill and copy kernels behind the phase graphs' memset- and copy-to-kernel passes (see
// CudaGraphExecutor's PhaseGraph).
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

/// Copies `width` elements of each of `height` rows, `srcPitch` and `dstPitch` bytes apart.
template <typename T>
__global__ void copyRows(char *dst, size_t dstPitch, const char *src, size_t srcPitch, size_t width,
                         size_t height) {
  const size_t n = width * height;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t row = i / width, column = i - row * width;
    reinterpret_cast<T *>(dst + row * dstPitch)[column] =
        reinterpret_cast<const T *>(src + row * srcPitch)[column];
  }
}

constexpr unsigned kThreads = 256;

/// Blocks for `n` threads' worth of work (a grid-stride loop covers the rest).
unsigned blocksFor(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 1024));
}

/// Adds a kernel node launching `func` with `args` (copied by cudaGraphAddKernelNode).
cudaError_t addKernel(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *dependencies,
                      size_t count, void *func, unsigned blocks, void **args) {
  cudaKernelNodeParams params{};
  params.func = func;
  params.gridDim = dim3(blocks);
  params.blockDim = dim3(kThreads);
  params.sharedMemBytes = 0;
  params.kernelParams = args;
  params.extra = nullptr;
  return cudaGraphAddKernelNode(node, graph, dependencies, count, &params);
}

template <typename T>
cudaError_t addNode(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *dependencies,
                    size_t count, char *dst, const FillPlan &plan) {
  size_t pitch = plan.pitch, width = plan.width, height = plan.height;
  T value = static_cast<T>(plan.word);
  void *args[] = {&dst, &pitch, &value, &width, &height};
  return addKernel(node, graph, dependencies, count, reinterpret_cast<void *>(&fillRows<T>),
                   blocksFor(width * height), args);
}

template <typename T>
cudaError_t addCopyNode(cudaGraphNode_t *node, cudaGraph_t graph,
                        const cudaGraphNode_t *dependencies, size_t count, char *dst,
                        const char *src, const CopyPlan &plan) {
  size_t dstPitch = plan.dstPitch, srcPitch = plan.srcPitch, width = plan.width,
         height = plan.height;
  void *args[] = {&dst, &dstPitch, &src, &srcPitch, &width, &height};
  return addKernel(node, graph, dependencies, count, reinterpret_cast<void *>(&copyRows<T>),
                   blocksFor(width * height), args);
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

cudaError_t addCopyKernelNode(cudaGraphNode_t *node, cudaGraph_t graph,
                              const cudaGraphNode_t *dependencies, size_t count,
                              const cudaMemcpy3DParms &copy) {
  // Linear memory only, one layer: a row `extent.width` bytes wide, `extent.height` rows.
  if (copy.srcArray || copy.dstArray || copy.extent.depth != 1)
    return cudaErrorNotSupported;
  auto at = [&copy](const cudaPitchedPtr &ptr, const cudaPos &pos) {
    return static_cast<char *>(ptr.ptr) + (pos.z * ptr.ysize + pos.y) * ptr.pitch + pos.x;
  };
  char *dst = at(copy.dstPtr, copy.dstPos);
  const char *src = at(copy.srcPtr, copy.srcPos);
  const std::optional<CopyPlan> plan = planCopy(reinterpret_cast<uintptr_t>(dst), copy.dstPtr.pitch,
                                                reinterpret_cast<uintptr_t>(src), copy.srcPtr.pitch,
                                                copy.extent.width, copy.extent.height);
  if (!plan)
    return cudaErrorNotSupported;
  switch (plan->wordBytes) {
  case 16:
    return addCopyNode<uint4>(node, graph, dependencies, count, dst, src, *plan);
  case 4:
    return addCopyNode<uint32_t>(node, graph, dependencies, count, dst, src, *plan);
  case 2:
    return addCopyNode<uint16_t>(node, graph, dependencies, count, dst, src, *plan);
  default:
    return addCopyNode<uint8_t>(node, graph, dependencies, count, dst, src, *plan);
  }
}

} // namespace ganc::backend
