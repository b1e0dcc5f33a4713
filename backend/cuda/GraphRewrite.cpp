// The memset/copy-to-kernel rewrite of captured graphs and their shape (see GraphRewrite.h).
#include "backend/cuda/GraphRewrite.h"

#ifdef GANC_WITH_CUDA_KERNELS
#include "backend/cuda/FillKernel.h"
#endif

#include <map>
#include <vector>

namespace ganc::backend {

namespace {

/// Clears a failed call's error; true on success.
bool ok(cudaError_t status) {
  if (status == cudaSuccess)
    return true;
  (void)cudaGetLastError();
  return false;
}

/// `graph`'s nodes into `out`; false if the runtime cannot list them.
bool listNodes(cudaGraph_t graph, std::vector<cudaGraphNode_t> &out) {
  size_t count = 0;
  if (!ok(cudaGraphGetNodes(graph, nullptr, &count)))
    return false;
  out.assign(count, nullptr);
  if (count > 0 && !ok(cudaGraphGetNodes(graph, out.data(), &count)))
    return false;
  out.resize(count);
  return true;
}

/// A node's dependencies (or dependents) into `out`; false if any of those edges carries data
/// (or the runtime cannot list them).
bool plainEdges(cudaGraphNode_t node, bool dependencies, std::vector<cudaGraphNode_t> &out) {
#if CUDART_VERSION >= 13000
  auto list = [&](cudaGraphNode_t *nodes, cudaGraphEdgeData *data, size_t *n) {
    return dependencies ? cudaGraphNodeGetDependencies(node, nodes, data, n)
                        : cudaGraphNodeGetDependentNodes(node, nodes, data, n);
  };
  size_t n = 0;
  if (!ok(list(nullptr, nullptr, &n)))
    return false;
  out.assign(n, nullptr);
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0 && !ok(list(out.data(), data.data(), &n)))
    return false;
  out.resize(n);
  for (size_t i = 0; i < n; ++i)
    if (data[i].type != cudaGraphDependencyTypeDefault || data[i].from_port != 0 ||
        data[i].to_port != 0)
      return false;
  return true;
#else
  size_t n = 0;
  auto list = [&](cudaGraphNode_t *nodes, size_t *count) {
    return dependencies ? cudaGraphNodeGetDependencies(node, nodes, count)
                        : cudaGraphNodeGetDependentNodes(node, nodes, count);
  };
  if (!ok(list(nullptr, &n)))
    return false;
  out.assign(n, nullptr);
  if (n > 0 && !ok(list(out.data(), &n)))
    return false;
  out.resize(n);
  return true;
#endif
}

cudaError_t addEdges(cudaGraph_t graph, const std::vector<cudaGraphNode_t> &from,
                     const std::vector<cudaGraphNode_t> &to) {
#if CUDART_VERSION >= 13000
  return cudaGraphAddDependencies(graph, from.data(), to.data(), nullptr, from.size());
#else
  return cudaGraphAddDependencies(graph, from.data(), to.data(), from.size());
#endif
}

cudaError_t edgeList(cudaGraph_t graph, cudaGraphNode_t *from, cudaGraphNode_t *to, size_t *count) {
#if CUDART_VERSION >= 13000
  // Edges with data (programmatic launch ports) are refused as a lossy query without it.
  std::vector<cudaGraphEdgeData> data(from ? *count : 0);
  return cudaGraphGetEdges(graph, from, to, from ? data.data() : nullptr, count);
#else
  return cudaGraphGetEdges(graph, from, to, count);
#endif
}

const char *nodeKind(cudaGraphNodeType type) {
  switch (type) {
  case cudaGraphNodeTypeKernel:
    return "kernel";
  case cudaGraphNodeTypeMemcpy:
    return "memcpy";
  case cudaGraphNodeTypeMemset:
    return "memset";
  case cudaGraphNodeTypeHost:
    return "host";
  case cudaGraphNodeTypeGraph:
    return "child_graph";
  case cudaGraphNodeTypeEmpty:
    return "empty";
  case cudaGraphNodeTypeWaitEvent:
    return "event_wait";
  case cudaGraphNodeTypeEventRecord:
    return "event_record";
  case cudaGraphNodeTypeMemAlloc:
    return "mem_alloc";
  case cudaGraphNodeTypeMemFree:
    return "mem_free";
  default:
    return "other";
  }
}

#ifdef GANC_WITH_CUDA_KERNELS
/// Puts the kernel node `add` makes in `node`'s place (its dependencies and dependents) and
/// removes `node`; false, the graph as it was, if the edges carry data or a call fails.
template <typename Add> bool replace(cudaGraph_t graph, cudaGraphNode_t node, Add &&add) {
  std::vector<cudaGraphNode_t> before, after;
  if (!plainEdges(node, /*dependencies=*/true, before) ||
      !plainEdges(node, /*dependencies=*/false, after))
    return false;
  cudaGraphNode_t kernel = nullptr;
  if (!ok(add(&kernel, graph, before.data(), before.size())))
    return false;
  const std::vector<cudaGraphNode_t> from(after.size(), kernel);
  if (!after.empty() && !ok(addEdges(graph, from, after))) {
    (void)cudaGraphDestroyNode(kernel); // back to the graph as captured
    return false;
  }
  // Both nodes write the same bytes before every dependent: the graph is right either way.
  return ok(cudaGraphDestroyNode(node));
}

/// Whether `ptr` is memory of GPU `device` (what a kernel there can read and write; a copy from
/// or to host, managed or another GPU's memory stays a copy).
bool onDevice(const void *ptr, int device) {
  cudaPointerAttributes attributes{};
  return ptr && ok(cudaPointerGetAttributes(&attributes, ptr)) &&
         attributes.type == cudaMemoryTypeDevice && attributes.device == device;
}

bool memsetToKernel(cudaGraph_t graph, cudaGraphNode_t node) {
  cudaMemsetParams memset{};
  return ok(cudaGraphMemsetNodeGetParams(node, &memset)) &&
         memset.width * memset.elementSize * memset.height <= kMaxNodeBytesAsKernel &&
         replace(graph, node,
                 [&memset](cudaGraphNode_t *kernel, cudaGraph_t g, const cudaGraphNode_t *before,
                           size_t count) {
                   return addFillKernelNode(kernel, g, before, count, memset);
                 });
}

bool copyToKernel(cudaGraph_t graph, cudaGraphNode_t node, int device) {
  cudaMemcpy3DParms copy{};
  return ok(cudaGraphMemcpyNodeGetParams(node, &copy)) &&
         copy.extent.width * copy.extent.height * copy.extent.depth <= kMaxNodeBytesAsKernel &&
         onDevice(copy.srcPtr.ptr, device) && onDevice(copy.dstPtr.ptr, device) &&
         replace(
             graph, node,
             [&copy](cudaGraphNode_t *kernel, cudaGraph_t g, const cudaGraphNode_t *before,
                     size_t count) { return addCopyKernelNode(kernel, g, before, count, copy); });
}
#endif

} // namespace

bool haveNodeKernels() {
#ifdef GANC_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

NodesReplaced nodesToKernels(cudaGraph_t graph, int device, const NodesAsKernels &kernels) {
  NodesReplaced replaced;
#ifdef GANC_WITH_CUDA_KERNELS
  std::vector<cudaGraphNode_t> nodes;
  if ((!kernels.memsets && !kernels.copies) || !listNodes(graph, nodes))
    return replaced;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (!ok(cudaGraphNodeGetType(node, &type)))
      continue;
    if (type == cudaGraphNodeTypeMemset && kernels.memsets && memsetToKernel(graph, node))
      ++replaced.memsets;
    else if (type == cudaGraphNodeTypeMemcpy && kernels.copies && copyToKernel(graph, node, device))
      ++replaced.copies;
  }
#else
  (void)graph, (void)device, (void)kernels; // no kernels to put in their place
#endif
  return replaced;
}

GraphShape graphShape(cudaGraph_t graph) {
  GraphShape shape;
  std::vector<cudaGraphNode_t> nodes;
  if (!listNodes(graph, nodes))
    return {};
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (!ok(cudaGraphNodeGetType(node, &type)))
      return {};
    ++shape.nodes[nodeKind(type)];
  }
  shape.nodes["total"] = static_cast<int64_t>(nodes.size());
  // Branches: roots beyond the first, and every dependent of a node beyond its first.
  size_t roots = 0, edges = 0;
  if (!ok(cudaGraphGetRootNodes(graph, nullptr, &roots)) ||
      !ok(edgeList(graph, nullptr, nullptr, &edges)))
    return {};
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  if (edges > 0 && !ok(edgeList(graph, from.data(), to.data(), &edges)))
    return {};
  std::map<cudaGraphNode_t, int64_t> dependents;
  for (size_t i = 0; i < edges; ++i)
    ++dependents[from[i]];
  shape.branches = roots > 1 ? static_cast<int64_t>(roots) - 1 : 0;
  for (const auto &[node, n] : dependents)
    shape.branches += n - 1;
  return shape;
}

} // namespace ganc::backend
