// Sample grids.
#include "runtime/Samples.h"

#include "backend/Device.h"
#include "runtime/Image.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

namespace ganc::runtime {

Status writeSamples(Session &s, int64_t step, bool last) {
  const auto &sample = s.spec().sample;
  if (!sample || !s.isRankZero())
    return Status::ok();
  const TrainOptions &o = s.options;
  // Whatever the generator's forward draws must not move the training streams.
  backend::ForkedRng fork(s.device);
  auto fixed = at::detail::createCPUGenerator(1234);
  std::vector<int64_t> shape = {o.samples};
  shape.insert(shape.end(), sample->noiseShape.begin(), sample->noiseShape.end());
  at::Tensor z = torch::randn(shape, fixed).to(s.inputType).to(s.device);
  torch::jit::Module generator = s.module().attr(sample->submodule).toModule();
  at::Tensor labels;
  if (sample->classes > 0)
    labels = torch::arange(o.samples, torch::kLong).remainder(sample->classes).to(s.device);
  // The grid is drawn a training batch at a time (the last one filled up with the first
  // samples and trimmed): a generator traced at export runs at the batch it was traced at,
  // and each sample's image does not depend on the others'.
  const int64_t chunk = std::max<int64_t>(1, s.spec().batchSize);
  std::vector<at::Tensor> parts;
  {
    torch::NoGradGuard noGrad;
    generator.eval();
    for (int64_t start = 0; start < o.samples; start += chunk) {
      const int64_t n = std::min(chunk, o.samples - start);
      at::Tensor rows =
          (torch::arange(start, start + chunk, torch::kLong) % o.samples).to(s.device);
      std::vector<c10::IValue> args{z.index_select(0, rows)};
      if (labels.defined())
        args.emplace_back(labels.index_select(0, rows));
      parts.push_back(generator.forward(args).toTensor().narrow(0, 0, n));
    }
    generator.train();
  }
  at::Tensor images = torch::cat(parts);
  GANC_TRY(writeSampleGrid(images, o.outDir + "/samples_step" + std::to_string(step) + ".png"));
  GANC_TRY(writeSampleGrid(images, o.outDir + "/samples.png"));
  if (last)
    std::cout << "samples: " << std::filesystem::absolute(o.outDir + "/samples.png").string()
              << std::endl;
  return Status::ok();
}

} // namespace ganc::runtime
