// Kernels that do what a memset node and a copy node do, for the phase graphs' node passes.
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

/// Adds to `graph`, after `dependencies`, a kernel node that copies what the copy node with
/// `copy`'s parameters copies, both of its ends being linear device memory the kernel can
/// address (the caller checks that). Returns the CUDA status; cudaErrorNotSupported (nothing
/// added) for a copy of no byte, from or to a CUDA array, or of more than one layer.
cudaError_t addCopyKernelNode(cudaGraphNode_t *node, cudaGraph_t graph,
                              const cudaGraphNode_t *dependencies, size_t count,
                              const cudaMemcpy3DParms &copy);

} // namespace ganc::backend
