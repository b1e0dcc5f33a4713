// What a CUDA Graph's capture of a graph-safe generator holds, read the same way whichever
// layout the installed PyTorch keeps it in: up to 2.11 on the generator state itself (one
// capture at a time), later per capture id in the state's map (concurrent captures). Both
// are internal to PyTorch; this header is the one place that reads them.
#pragma once

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>

#include <mutex>
#include <utility>

namespace ganc::backend {

/// A capture's view of one generator: the Philox offset its random ops consumed so far, and
/// the device tensors (seed, offset) every captured random op reads when the graph runs.
struct CapturedRng {
  bool found = false;
  uint64_t consumed = 0;
  at::TensorBase seed, offset;
};

namespace detail {

/// PyTorch with per-capture state (a map from capture id, under a mutex).
template <typename State>
auto capturedRng(const State &state, at::cuda::CaptureId_t id, int)
    -> decltype(state.capture_states_, CapturedRng()) {
  std::lock_guard<std::mutex> lock(state.capture_states_mutex_);
  auto found = state.capture_states_.find(id);
  if (found == state.capture_states_.end() || !found->second->is_initialized())
    return {};
  const auto &capture = *found->second;
  return {true, capture.offset_intragraph_, capture.rng_state_seed_extragraph_,
          capture.rng_state_offset_extragraph_};
}

/// PyTorch that keeps the one capture's state on the generator state itself.
template <typename State>
auto capturedRng(const State &state, at::cuda::CaptureId_t, long)
    -> decltype(state.offset_intragraph_, CapturedRng()) {
  if (!state.offset_extragraph_.defined())
    return {};
  return {true, state.offset_intragraph_, state.seed_extragraph_, state.offset_extragraph_};
}

} // namespace detail

/// The capture `id`'s view of the generator `state` (found false where it drew nothing).
inline CapturedRng capturedRng(const at::CUDAGeneratorState &state, at::cuda::CaptureId_t id) {
  return detail::capturedRng(state, id, 0);
}

} // namespace ganc::backend
