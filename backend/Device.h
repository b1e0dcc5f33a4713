// Per-device input plumbing: the step's batch in a static device buffer, and the generator
// that phase noise is drawn from.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace ganc::backend {

/// The step's data batch at a fixed device address (a captured graph reads it there). On
/// CUDA, `stage` copies through a ring of pinned host buffers with events, so refilling it
/// never waits for the GPU to finish the previous step; on CPU it just holds the batch.
class StagedBatch {
public:
  StagedBatch(std::vector<int64_t> shape, c10::ScalarType dtype, c10::Device device);
  ~StagedBatch();
  void stage(const at::Tensor &hostBatch);
  const at::Tensor &tensor() const { return device_; }

private:
  struct Ring;
  at::Tensor device_;
  std::unique_ptr<Ring> ring_;
};

/// The generator phase noise comes from, seeded with `seed`: a private CPU generator on CPU,
/// the default CUDA generator on GPUs (the one CUDA Graph capture keeps graph-safe).
at::Generator noiseGenerator(c10::Device device, uint64_t seed);

} // namespace ganc::backend
