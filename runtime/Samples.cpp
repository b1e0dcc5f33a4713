// Sample grids.
#include "runtime/Samples.h"

#include "backend/Device.h"
#include "runtime/Image.h"

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
  at::Tensor images;
  {
    torch::NoGradGuard noGrad;
    generator.eval();
    std::vector<c10::IValue> args{z};
    if (sample->classes > 0)
      args.emplace_back(
          torch::arange(o.samples, torch::kLong).remainder(sample->classes).to(s.device));
    images = generator.forward(args).toTensor();
    generator.train();
  }
  GANC_TRY(writeSampleGrid(images, o.outDir + "/samples_step" + std::to_string(step) + ".png"));
  GANC_TRY(writeSampleGrid(images, o.outDir + "/samples.png"));
  if (last)
    std::cout << "samples: " << std::filesystem::absolute(o.outDir + "/samples.png").string()
              << std::endl;
  return Status::ok();
}

} // namespace ganc::runtime
