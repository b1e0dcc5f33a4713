// The GPU hooks with CUDA (see backend/GpuHooks.h): StagedBatch's pinned ring and copy stream,
// PhaseTimer's event pairs, device synchronisation and the default CUDA generator.
#include "backend/GpuHooks.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include <deque>
#include <optional>

namespace ganc::backend::gpu {

namespace {

class CudaBatchRing : public BatchRing {
public:
  CudaBatchRing(const std::vector<int64_t> &shape, c10::ScalarType dtype, c10::Device device,
                bool copyStream) {
    if (copyStream) {
      landing_ = torch::empty(shape, at::TensorOptions(device).dtype(dtype));
      copyStream_ = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    }
    for (int i = 0; i < kSlots; ++i) {
      pinned_.push_back(torch::empty(shape, at::TensorOptions(dtype).pinned_memory(true)));
      copied_.emplace_back();
    }
  }

  void stage(at::Tensor &into, const at::Tensor &source, const at::Tensor &indices) override {
    const int slot = next_;
    next_ = (slot + 1) % kSlots;
    // Waits only if the transfer out of this buffer, four batches ago, is somehow still pending.
    copied_[slot].synchronize();
    at::index_select_out(pinned_[slot], source, 0, indices);
    const at::cuda::CUDAStream compute = at::cuda::getCurrentCUDAStream();
    if (!copyStream_) { // in order on the compute stream, straight into place
      into.copy_(pinned_[slot], /*non_blocking=*/true);
      copied_[slot].record(compute);
      return;
    }
    // The landing buffer is refilled once the compute stream has moved its last batch out; the
    // transfer then runs beside whatever the compute stream still has queued.
    consumed_.block(*copyStream_);
    {
      c10::cuda::CUDAStreamGuard guard(*copyStream_);
      landing_.copy_(pinned_[slot], /*non_blocking=*/true);
    }
    copied_[slot].record(*copyStream_);
    landed_.record(*copyStream_);
    // In stream order after the queued phases that read the previous batch at this address.
    landed_.block(compute);
    into.copy_(landing_, /*non_blocking=*/true);
    consumed_.record(compute);
  }

private:
  static constexpr int kSlots = 4;
  std::vector<at::Tensor> pinned_;
  std::vector<at::cuda::CUDAEvent> copied_; // the transfer out of each pinned buffer is done
  int next_ = 0;
  std::optional<at::cuda::CUDAStream> copyStream_; // none: the copies run on the compute stream
  at::Tensor landing_;                             // on the device, in the pinned buffers' layout
  at::cuda::CUDAEvent landed_;                     // the last transfer into `landing` is done
  at::cuda::CUDAEvent consumed_; // the last batch in `landing` has moved into place
};

class CudaEventTimer : public EventTimer {
public:
  void begin() override {
    if (free_.empty()) {
      open_ = std::make_unique<Pair>();
    } else {
      open_ = std::move(free_.back());
      free_.pop_back();
    }
    open_->start.record(at::cuda::getCurrentCUDAStream());
  }

  void end(size_t index) override {
    if (!open_)
      return;
    open_->end.record(at::cuda::getCurrentCUDAStream());
    open_->index = index;
    pending_.push_back(std::move(open_));
  }

  void collect(bool wait, std::vector<double> &seconds) override {
    while (!pending_.empty()) {
      Pair &pair = *pending_.front();
      if (wait)
        pair.end.synchronize();
      else if (!pair.end.query())
        return;
      if (seconds.size() <= pair.index)
        seconds.resize(pair.index + 1, 0.0);
      seconds[pair.index] += pair.start.elapsed_time(pair.end) / 1000.0;
      free_.push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
  }

private:
  struct Pair {
    at::cuda::CUDAEvent start{cudaEventDefault};
    at::cuda::CUDAEvent end{cudaEventDefault};
    size_t index = 0;
  };
  std::deque<std::unique_ptr<Pair>> pending_;
  std::vector<std::unique_ptr<Pair>> free_; // recorded pairs are reused, never re-created
  std::unique_ptr<Pair> open_;
};

} // namespace

bool built() { return true; }

std::unique_ptr<BatchRing> makeBatchRing(const std::vector<int64_t> &shape, c10::ScalarType dtype,
                                         c10::Device device, bool copyStream) {
  return std::make_unique<CudaBatchRing>(shape, dtype, device, copyStream);
}

std::unique_ptr<EventTimer> makeEventTimer() { return std::make_unique<CudaEventTimer>(); }

void synchronize() { C10_CUDA_CHECK(cudaDeviceSynchronize()); }

at::Generator defaultGenerator(c10::Device device) {
  return at::cuda::detail::getDefaultCUDAGenerator(device.index());
}

} // namespace ganc::backend::gpu
