// Sample grids.
#include "runtime/Samples.h"

#include "backend/Device.h"
#include "runtime/Image.h"
#include "support/torch/TorchError.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

namespace ganc::runtime {

namespace {

/// The grid's fixed inputs: noise of the spec's shape for `count` samples and, for a
/// conditional generator, labels cycling through its classes.
struct GridInputs {
  at::Tensor noise, labels;
};

GridInputs gridInputs(const Session &s, int64_t count) {
  const auto &sample = *s.spec().sample;
  auto fixed = at::detail::createCPUGenerator(1234);
  std::vector<int64_t> shape = {count};
  shape.insert(shape.end(), sample.noiseShape.begin(), sample.noiseShape.end());
  GridInputs in;
  in.noise = torch::randn(shape, fixed).to(s.inputType).to(s.device);
  if (sample.classes > 0)
    in.labels = torch::arange(count, torch::kLong).remainder(sample.classes).to(s.device);
  return in;
}

/// The generator on the grid's samples `start` onward, a training batch of them (wrapping
/// around to the first), in eval mode and without gradients; the first `n` of its outputs.
at::Tensor drawBatch(Session &s, const GridInputs &in, int64_t start, int64_t n) {
  const int64_t count = in.noise.size(0);
  const int64_t chunk = std::max<int64_t>(1, s.spec().batchSize);
  at::Tensor rows = (torch::arange(start, start + chunk, torch::kLong) % count).to(s.device);
  std::vector<c10::IValue> args{in.noise.index_select(0, rows)};
  if (in.labels.defined())
    args.emplace_back(in.labels.index_select(0, rows));
  torch::jit::Module generator = s.module().attr(s.spec().sample->submodule).toModule();
  torch::NoGradGuard noGrad;
  generator.eval();
  c10::IValue out = generator.forward(args);
  generator.train();
  TORCH_CHECK(out.isTensor(), "it returned a ", out.tagKind(), ", not a tensor");
  const at::Tensor images = out.toTensor();
  TORCH_CHECK(images.dim() >= 1 && images.size(0) == chunk, "it returned ", images.sizes(),
              " for a batch of ", chunk);
  return images.narrow(0, 0, n);
}

} // namespace

Status checkSampler(Session &s) {
  const auto &sample = s.spec().sample;
  if (!sample || s.options.sampleEvery == 0 || !s.isRankZero())
    return Status::ok();
  backend::ForkedRng fork(s.device);
  try {
    drawBatch(s, gridInputs(s, s.options.samples), 0, 1);
  } catch (const std::exception &e) {
    return Status::error("spec sample: " + sample->submodule + ".forward on noise of shape " +
                         c10::str(c10::IntArrayRef(sample->noiseShape)) +
                         (sample->classes > 0 ? " with labels" : "") +
                         " (a batch of them) fails, so the first sample grid would: " +
                         firstLine(e) + " (--sample-every 0 draws none)");
  }
  return Status::ok();
}

Status writeSamples(Session &s, int64_t step, bool last) {
  if (!s.spec().sample || !s.isRankZero())
    return Status::ok();
  const TrainOptions &o = s.options;
  // Whatever the generator's forward draws must not move the training streams.
  backend::ForkedRng fork(s.device);
  const GridInputs in = gridInputs(s, o.samples);
  // The grid is drawn a training batch at a time (the last one filled up with the first
  // samples and trimmed): a generator traced at export runs at the batch it was traced at,
  // and each sample's image does not depend on the others'.
  const int64_t chunk = std::max<int64_t>(1, s.spec().batchSize);
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < o.samples; start += chunk)
    parts.push_back(drawBatch(s, in, start, std::min(chunk, o.samples - start)));
  at::Tensor images = torch::cat(parts);
  GANC_TRY(writeSampleGrid(images, o.outDir + "/samples_step" + std::to_string(step) + ".png"));
  GANC_TRY(writeSampleGrid(images, o.outDir + "/samples.png"));
  if (last)
    std::cout << "samples: " << std::filesystem::absolute(o.outDir + "/samples.png").string()
              << std::endl;
  return Status::ok();
}

} // namespace ganc::runtime
