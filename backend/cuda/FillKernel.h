// A kernel that does what a memset node does, for the phase graphs' memset-to-kernel pass.
#pragma once

#include <cuda_runtime_api.h>

namespace ganc::backend {

/// Adds to `graph`, after `dependencies`, a kernel node that writes what the memset node with
/// `memset`'s parameters writes (its value in every element of every row). Returns the CUDA
/// status; cudaErrorNotSupported (nothing added) for a memset of no bytes or of an element
/// size other than 1, 2 or 4.
cudaError_t addFillKernelNode(cudaGraphNode_t *node, cudaGraph_t graph,
                              const cudaGraphNode_t *dependencies, size_t count,
                              const cudaMemsetParams &memset);

} // namespace ganc::backend
