// A captured phase replayed at one launch (see PhaseGraph.h).
#include "backend/cuda/PhaseGraph.h"

#include "backend/cuda/GeneratorCapture.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace ganc::backend {

void PhaseGraph::advanceOffsetsOnDevice() {
  for (auto &[state, unused] : captured_generator_states_) {
    const CapturedRng rng = capturedRng(*state, capture_id_);
    if (rng.found && rng.consumed != 0) {
      at::Tensor(rng.offset).add_(static_cast<int64_t>(rng.consumed));
      advanced_[state.get()] = rng.consumed;
    }
  }
}

void PhaseGraph::finishCapture(const NodesAsKernels &kernels) {
  size_t drawing = 0;
  for (const auto &[state, increment] : captured_generator_states_) {
    if (increment == 0)
      continue;
    ++drawing;
    auto it = advanced_.find(state.get());
    if (it == advanced_.end() || it->second != increment)
      fillAlways_ = true;
  }
  fillAlways_ = fillAlways_ || drawing != advanced_.size();
  const NodesReplaced replaced = nodesToKernels(graph_, capture_stream_.device_index(), kernels);
  shape_ = graphShape(graph_);
  shape_.memsetsAsKernels = replaced.memsets;
  shape_.copiesAsKernels = replaced.copies;
  if (!has_graph_exec_)
    instantiate();
}

void PhaseGraph::advanceGenerators(RngOnDevice &rng) {
  for (auto &[state, increment] : captured_generator_states_) {
    if (increment == 0)
      continue;
    auto known = rng.known.find(state.get());
    if (fillAlways_ || known == rng.known.end() || known->second.seed != state->seed_ ||
        known->second.offset != state->philox_offset_per_thread_) {
      const CapturedRng captured = capturedRng(*state, capture_id_);
      TORCH_CHECK(captured.found, "a captured phase's generator state has no capture record");
      at::Tensor(captured.seed).fill_(static_cast<int64_t>(state->seed_));
      at::Tensor(captured.offset).fill_(static_cast<int64_t>(state->philox_offset_per_thread_));
    }
    TORCH_INTERNAL_ASSERT(state->philox_offset_per_thread_ % 4 == 0,
                          "RNG offset must be a multiple of 4");
    state->philox_offset_per_thread_ += (increment + 3) / 4 * 4; // CUDAGeneratorState::increase
    if (fillAlways_)
      rng.known.erase(state.get());
    else
      rng.known[state.get()] = {state->seed_, state->philox_offset_per_thread_};
  }
}

void PhaseGraph::launch(RngOnDevice &rng) {
  c10::OptionalDeviceGuard deviceGuard{capture_stream_.device()};
  advanceGenerators(rng);
  C10_CUDA_CHECK(cudaGraphLaunch(graph_exec_, at::cuda::getCurrentCUDAStream()));
}

} // namespace ganc::backend
