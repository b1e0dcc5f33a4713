// The GPU hooks of a build without CUDA (see backend/GpuHooks.h): no GPU parts.
#include "backend/GpuHooks.h"

namespace ganc::backend::gpu {

bool built() { return false; }

std::unique_ptr<BatchRing> makeBatchRing(const std::vector<int64_t> &, c10::ScalarType, c10::Device,
                                         bool) {
  return nullptr;
}

std::unique_ptr<EventTimer> makeEventTimer() { return nullptr; }

void synchronize() {}

at::Generator defaultGenerator(c10::Device) { return {}; }

} // namespace ganc::backend::gpu
