// A captured phase whose replay is one graph launch, and what the generators' device tensors
// hold between launches.
#pragma once

#include "backend/Executor.h"
#include "backend/cuda/GraphRewrite.h"

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>

#include <map>

namespace ganc::backend {

/// What the graph-safe generators' device tensors (the seed and the offset every captured
/// random op reads when it runs) hold once the work enqueued so far has run, per generator
/// state; a state not listed is unknown.
struct RngOnDevice {
  struct Known {
    uint64_t seed = 0;
    uint64_t offset = 0;
  };
  std::map<const at::CUDAGeneratorState *, Known> known;
};

/// A captured phase whose replay is one graph launch. PyTorch's CUDAGraph::replay writes a
/// generator's seed and Philox offset into those device tensors with two fill kernels before
/// every launch of a graph that draws random numbers (noise, dropout, augmentation): two
/// dispatcher calls and two kernel launches of host time per replayed phase. Here the graph
/// itself advances the offset tensor, as its last node, by the offsets it consumed, and the
/// host advances the generator's own offset as PyTorch does; so while nothing else drew from
/// the generator or captured since the previous replay, the device already holds what the
/// fills would write and they are skipped. Anything else (an eager phase's draws, a new
/// capture, a reseed) makes the host and device disagree, and the replay writes them as
/// PyTorch does. The random numbers are the same either way.
class PhaseGraph : public at::cuda::CUDAGraph {
public:
  /// The captured graph is kept beside its executable: step graphs take it as a child, and
  /// finishCapture counts its nodes.
  PhaseGraph() : at::cuda::CUDAGraph(/*keep_graph=*/true) {}

  /// Inside the capture, after the phase's work: the offset advance as the graph's last node.
  void advanceOffsetsOnDevice();

  /// After capture_end: the replay can skip the fills only if the graph advances exactly the
  /// offsets the capture recorded (otherwise every replay writes them, as PyTorch's does).
  /// The node passes `kernels` asks for run first (memset and copy nodes become kernel nodes).
  /// A kept graph is instantiated here (PyTorch defers that to its first replay).
  void finishCapture(const NodesAsKernels &kernels);

  /// The captured graph's nodes by kind and its branches (what a launch submits;
  /// timing.json's graph_nodes and graph_branches).
  const GraphShape &shape() const { return shape_; }

  /// Whether the graph keeps the generators' device offsets itself (a step graph can hold it).
  bool advancesOffsets() const { return !fillAlways_; }

  /// The host side of a run of the graph, before it is launched: writes the generators'
  /// device tensors where they do not already hold the host state, then advances the host
  /// state by the offsets the graph consumes, as CUDAGeneratorState::replay_prologue does.
  void advanceGenerators(RngOnDevice &rng);

  /// One replay on the current stream.
  void launch(RngOnDevice &rng);

private:
  std::map<const at::CUDAGeneratorState *, uint64_t> advanced_;
  bool fillAlways_ = false;
  GraphShape shape_;
};

} // namespace ganc::backend
