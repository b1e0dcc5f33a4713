// The captured graphs' node rewrite (memset and copy nodes into kernel nodes) and their shape,
// on graphs built by hand: the rewritten graph writes the bytes the graph as built writes (run
// first, as the oracle, on the same GPU), keeps its order, and leaves alone what it must not
// replace (a copy from host memory, a memset over the size limit). Skipped, visibly, where no
// GPU is present.
#include "backend/cuda/GraphRewrite.h"

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace ganc::backend {
namespace {

bool haveGpu() {
  int count = 0;
  const bool found = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return found;
}

#define SKIP_WITHOUT_GPU()                                                                         \
  if (!haveGpu())                                                                                  \
  GTEST_SKIP() << "no GPU on this machine"

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr size_t kBytes = 64 * 1024;

/// Adds a 1-D copy node of `bytes` after `after`.
void addCopy(cudaGraph_t graph, cudaGraphNode_t *node, cudaGraphNode_t after, void *from, void *to,
             size_t bytes, cudaMemcpyKind kind) {
  cudaMemcpy3DParms copy{};
  copy.srcPtr = make_cudaPitchedPtr(from, bytes, bytes, 1);
  copy.dstPtr = make_cudaPitchedPtr(to, bytes, bytes, 1);
  copy.extent = make_cudaExtent(bytes, 1, 1);
  copy.kind = kind;
  cudaGraphAddMemcpyNode(node, graph, &after, 1, &copy);
}

/// A graph over `buffer` (kBytes of device memory) and `host` (kBytes of pinned host memory):
/// memset (1-byte elements, 1000 of them), then a 2-D memset of 4-byte elements over rows of a
/// pitched region, then a device-to-device copy of the first 4 KiB to offset 32 KiB, then a
/// host-to-device copy; and, beside the chain, a second root writing 2-byte elements.
cudaGraph_t buildGraph(uint8_t *buffer, uint8_t *host) {
  cudaGraph_t graph = nullptr;
  cudaGraphCreate(&graph, 0);
  cudaMemsetParams bytes{};
  bytes.dst = buffer;
  bytes.value = 0x5a;
  bytes.elementSize = 1;
  bytes.width = 1000;
  bytes.height = 1;
  cudaGraphNode_t first = nullptr, second = nullptr, copy = nullptr, upload = nullptr,
                  side = nullptr;
  cudaGraphAddMemsetNode(&first, graph, nullptr, 0, &bytes);
  cudaMemsetParams rows{};
  rows.dst = buffer + 1024;
  rows.pitch = 512;
  rows.value = 0x01020304;
  rows.elementSize = 4;
  rows.width = 100;
  rows.height = 5;
  cudaGraphAddMemsetNode(&second, graph, &first, 1, &rows);
  addCopy(graph, &copy, second, buffer, buffer + 32 * 1024, 4096, cudaMemcpyDeviceToDevice);
  addCopy(graph, &upload, copy, host, buffer + 40 * 1024, 256, cudaMemcpyHostToDevice);
  cudaMemsetParams halves{};
  halves.dst = buffer + 48 * 1024;
  halves.value = 0xbeef;
  halves.elementSize = 2;
  halves.width = 777;
  halves.height = 1;
  cudaGraphAddMemsetNode(&side, graph, nullptr, 0, &halves);
  return graph;
}

/// Runs `graph` once over a buffer first filled with 0x11 and returns the buffer's bytes.
std::vector<uint8_t> runOnce(cudaGraph_t graph, uint8_t *buffer) {
  std::vector<uint8_t> out(kBytes);
  cudaGraphExec_t exec = nullptr;
  if (cudaMemset(buffer, 0x11, kBytes) != cudaSuccess ||
      cudaGraphInstantiateWithFlags(&exec, graph, 0) != cudaSuccess ||
      cudaGraphLaunch(exec, nullptr) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(out.data(), buffer, kBytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    out.clear();
  if (exec)
    cudaGraphExecDestroy(exec);
  return out;
}

TEST(GraphRewriteTest, NodesBecomeKernelsThatWriteTheSameBytes) {
  SKIP_WITHOUT_GPU();
  if (!haveNodeKernels())
    GTEST_SKIP() << "this build has no CUDA compiler, so no node kernels";
  uint8_t *buffer = nullptr, *host = nullptr;
  CUDA_OK(cudaMalloc(&buffer, kBytes));
  CUDA_OK(cudaMallocHost(&host, 256));
  for (int i = 0; i < 256; ++i)
    host[i] = static_cast<uint8_t>(i * 7);

  cudaGraph_t graph = buildGraph(buffer, host);
  const GraphShape before = graphShape(graph);
  EXPECT_EQ(before.nodes.at("memset"), 3);
  EXPECT_EQ(before.nodes.at("memcpy"), 2);
  EXPECT_EQ(before.nodes.at("total"), 5);
  EXPECT_EQ(before.branches, 1); // the second root
  const std::vector<uint8_t> expected = runOnce(graph, buffer);
  ASSERT_EQ(expected.size(), kBytes);

  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  const NodesReplaced replaced = nodesToKernels(graph, device, {});
  EXPECT_EQ(replaced.memsets, 3);
  EXPECT_EQ(replaced.copies, 1); // the copy from host memory stays a copy
  const GraphShape after = graphShape(graph);
  EXPECT_EQ(after.nodes.at("kernel"), 4);
  EXPECT_EQ(after.nodes.at("memcpy"), 1);
  EXPECT_EQ(after.nodes.count("memset"), 0u);
  EXPECT_EQ(after.nodes.at("total"), 5);
  EXPECT_EQ(after.branches, before.branches); // same dependencies and dependents
  EXPECT_EQ(runOnce(graph, buffer), expected);

  cudaGraphDestroy(graph);
  cudaFreeHost(host);
  cudaFree(buffer);
}

TEST(GraphRewriteTest, OnlyTheKindsAskedForAndWithinTheLimit) {
  SKIP_WITHOUT_GPU();
  if (!haveNodeKernels())
    GTEST_SKIP() << "this build has no CUDA compiler, so no node kernels";
  uint8_t *buffer = nullptr, *host = nullptr, *big = nullptr;
  CUDA_OK(cudaMalloc(&buffer, kBytes));
  CUDA_OK(cudaMallocHost(&host, 256));
  CUDA_OK(cudaMalloc(&big, kMaxNodeBytesAsKernel + 4));

  cudaGraph_t graph = buildGraph(buffer, host);
  NodesReplaced replaced = nodesToKernels(graph, 0, {/*memsets=*/false, /*copies=*/true});
  EXPECT_EQ(replaced.memsets, 0);
  EXPECT_EQ(replaced.copies, 1);
  replaced = nodesToKernels(graph, 0, {/*memsets=*/false, /*copies=*/false});
  EXPECT_EQ(replaced.memsets + replaced.copies, 0);
  cudaGraphDestroy(graph);

  cudaGraph_t large = nullptr;
  CUDA_OK(cudaGraphCreate(&large, 0));
  cudaMemsetParams over{};
  over.dst = big;
  over.elementSize = 1;
  over.width = kMaxNodeBytesAsKernel + 1;
  over.height = 1;
  cudaGraphNode_t node = nullptr;
  CUDA_OK(cudaGraphAddMemsetNode(&node, large, nullptr, 0, &over));
  EXPECT_EQ(nodesToKernels(large, 0, {}).memsets, 0);
  EXPECT_EQ(graphShape(large).nodes.at("memset"), 1);
  cudaGraphDestroy(large);

  cudaFree(big);
  cudaFreeHost(host);
  cudaFree(buffer);
}

} // namespace
} // namespace ganc::backend
