// StagedBatch and the noise generator, for CPU and (when built with it) CUDA.
#include "backend/Device.h"

#ifdef GANC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace ganc::backend {

struct StagedBatch::Ring {
#ifdef GANC_WITH_CUDA
  static constexpr int kSlots = 4;
  std::vector<at::Tensor> pinned;
  std::vector<at::cuda::CUDAEvent> copied;
  int next = 0;
#endif
};

StagedBatch::StagedBatch(std::vector<int64_t> shape, c10::ScalarType dtype, c10::Device device) {
  if (!device.is_cuda())
    return;
#ifdef GANC_WITH_CUDA
  device_ = torch::empty(shape, at::TensorOptions(device).dtype(dtype));
  ring_ = std::make_unique<Ring>();
  for (int i = 0; i < Ring::kSlots; ++i) {
    ring_->pinned.push_back(torch::empty(shape, at::TensorOptions(dtype).pinned_memory(true)));
    ring_->copied.emplace_back();
  }
#endif
}

StagedBatch::~StagedBatch() = default;

void StagedBatch::stage(const at::Tensor &hostBatch) {
  if (!ring_) {
    device_ = hostBatch;
    return;
  }
#ifdef GANC_WITH_CUDA
  int slot = ring_->next;
  ring_->next = (slot + 1) % Ring::kSlots;
  // Waits only if the copy out of this slot, four steps ago, is somehow still pending.
  ring_->copied[slot].synchronize();
  ring_->pinned[slot].copy_(hostBatch);
  device_.copy_(ring_->pinned[slot], /*non_blocking=*/true);
  ring_->copied[slot].record(at::cuda::getCurrentCUDAStream());
#endif
}

at::Generator noiseGenerator(c10::Device device, uint64_t seed) {
#ifdef GANC_WITH_CUDA
  if (device.is_cuda()) {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
    return gen;
  }
#endif
  return at::detail::createCPUGenerator(seed);
}

} // namespace ganc::backend
