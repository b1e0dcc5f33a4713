// What the device plumbing (Device.cpp) needs of a GPU, behind one interface: implemented with
// CUDA in backend/cuda/CudaHooks.cpp where the torch wheel has CUDA, and by
// backend/cpu/NoGpuHooks.cpp (no GPU parts) where it does not. Device.cpp has no #ifdef.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

namespace ganc::backend::gpu {

/// Whether this build has the GPU parts (a GPU may still be absent).
bool built();

/// The host-to-device path of StagedBatch on a GPU (see there): a ring of pinned host buffers
/// and, with a copy stream, a landing buffer on the device.
class BatchRing {
public:
  virtual ~BatchRing() = default;
  /// Gathers `source`'s samples `indices` and moves them into `into` (on the device).
  virtual void stage(at::Tensor &into, const at::Tensor &source, const at::Tensor &indices) = 0;
};
/// Null where the build has no GPU parts.
std::unique_ptr<BatchRing> makeBatchRing(const std::vector<int64_t> &shape, c10::ScalarType dtype,
                                         c10::Device device, bool copyStream);

/// PhaseTimer's device side: an event pair around each phase launch, read once passed.
class EventTimer {
public:
  virtual ~EventTimer() = default;
  virtual void begin() = 0;
  virtual void end(size_t index) = 0;
  /// Adds each passed pair's seconds to `seconds[index]`; with `wait`, waits for all.
  virtual void collect(bool wait, std::vector<double> &seconds) = 0;
};
/// Null where the build has no GPU parts.
std::unique_ptr<EventTimer> makeEventTimer();

/// Waits for all work on the current GPU (nothing without GPU parts).
void synchronize();

/// The default generator of GPU `device` (undefined without GPU parts).
at::Generator defaultGenerator(c10::Device device);

} // namespace ganc::backend::gpu
