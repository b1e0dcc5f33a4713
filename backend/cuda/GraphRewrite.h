// Rewrites of a captured CUDA graph before it is instantiated, and its shape: plain functions
// of a cudaGraph_t, so they are tested on graphs built by hand (tests/unit/GraphRewriteTest.cpp)
// as well as on the phases' captures.
#pragma once

#include "backend/Executor.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ganc::backend {

/// Which of a captured graph's other nodes become kernel nodes (--memset-nodes, --copy-nodes).
struct NodesAsKernels {
  bool memsets = true;
  bool copies = true;
};

/// How many nodes nodesToKernels replaced, by kind.
struct NodesReplaced {
  int64_t memsets = 0;
  int64_t copies = 0;
};

/// Memset and copy nodes up to this size become kernels; a larger one's bandwidth outweighs
/// the idle around its node.
constexpr size_t kMaxNodeBytesAsKernel = size_t{1} << 20;

/// Whether this build has the kernels nodesToKernels puts in the nodes' place (ganc's fill
/// kernel, built where the toolkit has nvcc); without them nodesToKernels replaces nothing.
bool haveNodeKernels();

/// The memset- and copy-to-kernel passes: replace each memset node of `graph` (PyTorch's
/// reductions clear their semaphores with cudaMemsetAsync, cuDNN its workspaces) and each copy
/// node between two places in the memory of GPU `device` (a tensor's copy_, such as the phase
/// outputs' copy out of the pool), up to kMaxNodeBytesAsKernel, with a kernel node writing the
/// same bytes, with the same dependencies and dependents. In DCGAN-64's phase graphs on an
/// H100 (41 memsets per step) the GPU idled 1.5 us before and 2.4 us after each memset node,
/// against 0.4 us between two kernel nodes: 178 of the 265 us of idle per step. A node whose
/// edges carry data (programmatic launches), or that the runtime refuses to replace, stays as
/// it was.
NodesReplaced nodesToKernels(cudaGraph_t graph, int device, const NodesAsKernels &kernels);

/// `graph`'s nodes by kind ("total" too) and its branches. Only a statistic: where the runtime
/// cannot list them, the shape is empty.
GraphShape graphShape(cudaGraph_t graph);

} // namespace ganc::backend
