// Sample grids.
#include "runtime/rundir/Samples.h"

#include "backend/Device.h"
#include "runtime/data/Image.h"
#include "support/torch/TorchError.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

namespace ganc::runtime {

namespace {

/// The grid's fixed inputs for `count` samples, in the sampler's argument order: noise of the
/// spec's shape from a fixed seed, class ids cycling through the classes, and (for a method)
/// the data set's first samples and their labels.
std::vector<at::Tensor> gridInputs(const Session &s, const PhaseInputs &data, int64_t count) {
  const frontend::SampleSpec &sample = *s.spec().sample;
  auto fixed = at::detail::createCPUGenerator(1234);
  const at::Tensor cycle = torch::arange(count, torch::kLong);
  std::vector<at::Tensor> in;
  auto noise = [&](const std::vector<int64_t> &shape, bool uniform) {
    std::vector<int64_t> full = {count};
    full.insert(full.end(), shape.begin(), shape.end());
    at::Tensor z = uniform ? torch::rand(full, fixed) : torch::randn(full, fixed);
    return z.to(s.inputType);
  };
  if (sample.method.empty()) {
    in.push_back(noise(sample.noiseShape, false));
    if (sample.classes > 0)
      in.push_back(cycle.remainder(sample.classes));
  }
  for (const frontend::InputSpec &input : sample.inputs) {
    switch (input.source) {
    case frontend::InputSource::Data:
      in.push_back(
          fieldOf(s.spec(), input,
                  data.dataset().index_select(0, cycle.remainder(data.dataset().size(0)))));
      break;
    case frontend::InputSource::Labels:
      in.push_back(data.labels().index_select(0, cycle.remainder(data.labels().size(0))));
      break;
    case frontend::InputSource::Categorical:
      in.push_back(cycle.remainder(input.classes));
      break;
    default: // normal, uniform (the spec allows nothing else here)
      in.push_back(noise(input.shape, input.source == frontend::InputSource::Uniform));
    }
  }
  for (at::Tensor &t : in)
    t = t.to(s.device);
  return in;
}

/// Every buffer of the module, copied (a training-mode draw is undone with them).
std::vector<std::pair<at::Tensor, at::Tensor>> bufferCopies(torch::jit::Module &module) {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (const auto &b : module.named_buffers(/*recurse=*/true))
    copies.emplace_back(b.value, b.value.clone());
  return copies;
}

} // namespace

c10::IValue runSampler(Session &s, const std::vector<c10::IValue> &args) {
  const backend::JointProgram &sampler = *s.sampler;
  std::map<std::string, at::Tensor> given;
  for (const auto &p : s.module().named_parameters(/*recurse=*/true))
    given[p.name] = p.value;
  for (const auto &b : s.module().named_buffers(/*recurse=*/true))
    given[b.name] = b.value;
  size_t next = 0;
  for (const JointPort &port : sampler.graph().inputs)
    if (port.kind == "input" && next < args.size())
      given[port.name] = args[next++].toTensor();
  auto out = sampler.run(given, [](const std::string &, const at::Tensor &) {});
  if (!out)
    throw std::runtime_error(out.status().message());
  if (out->size() == 1)
    return out->front();
  return c10::ivalue::Tuple::create(std::vector<c10::IValue>(out->begin(), out->end()));
}

namespace {

/// The sampler on the grid's samples `start` onward, a training batch of them (wrapping
/// around to the first), without gradients, in eval mode or (`mode: train`) in training mode
/// with the buffers put back; the first `n` of its outputs, [n, K, ...] for the K image
/// batches it returned (1 for a plain tensor).
at::Tensor drawBatch(Session &s, const std::vector<at::Tensor> &in, int64_t start, int64_t n) {
  const frontend::SampleSpec &sample = *s.spec().sample;
  const int64_t count = in.front().size(0);
  const int64_t chunk = std::max<int64_t>(1, s.spec().batchSize);
  at::Tensor rows = (torch::arange(start, start + chunk, torch::kLong) % count).to(s.device);
  std::vector<c10::IValue> args;
  for (const at::Tensor &t : in)
    args.emplace_back(t.index_select(0, rows));
  torch::jit::Module module =
      sample.method.empty() ? s.module().attr(sample.submodule).toModule() : s.module();
  torch::NoGradGuard noGrad;
  const auto buffers = sample.train ? bufferCopies(module) : decltype(bufferCopies(module))();
  if (!sample.train)
    module.eval();
  c10::IValue out = s.sampler               ? runSampler(s, args)
                    : sample.method.empty() ? module.forward(args)
                                            : module.get_method(sample.method)(args);
  module.train();
  for (const auto &[buffer, copy] : buffers)
    buffer.copy_(copy);
  std::vector<at::Tensor> images;
  if (out.isTuple())
    for (const c10::IValue &element : out.toTupleRef().elements()) {
      TORCH_CHECK(element.isTensor(), "it returned a tuple holding a ", element.tagKind());
      images.push_back(element.toTensor());
    }
  else
    TORCH_CHECK(out.isTensor(), "it returned a ", out.tagKind(), ", not a tensor");
  if (images.empty())
    images.push_back(out.toTensor());
  for (const at::Tensor &batch : images)
    TORCH_CHECK(batch.dim() >= 1 && batch.size(0) == chunk && batch.sizes() == images[0].sizes(),
                "it returned ", batch.sizes(), " for a batch of ", chunk,
                images.size() > 1 ? " (the images of a tuple must have one shape)" : "");
  return torch::stack(images, 1).narrow(0, 0, n);
}

/// What the sampler is, for messages.
std::string samplerName(const frontend::SampleSpec &sample) {
  std::string inputs;
  for (const frontend::InputSpec &in : sample.inputs)
    inputs += (inputs.empty() ? "" : ", ") + in.name;
  return sample.method.empty() ? sample.submodule + ".forward on noise of shape " +
                                     c10::str(c10::IntArrayRef(sample.noiseShape)) +
                                     (sample.classes > 0 ? " with labels" : "")
                               : "method " + sample.method + "(" + inputs + ")";
}

} // namespace

Status checkSampler(Session &s, const PhaseInputs &inputs) {
  const auto &sample = s.spec().sample;
  if (!sample || s.options.sampleEvery == 0 || !s.isRankZero())
    return Status::ok();
  backend::ForkedRng fork(s.device);
  try {
    drawBatch(s, gridInputs(s, inputs, s.options.samples), 0, 1);
  } catch (const std::exception &e) {
    return Status::error("spec sample: " + samplerName(*sample) +
                         " (a batch of them) fails, so the first sample grid would: " +
                         firstLine(e) + " (--sample-every 0 draws none)");
  }
  return Status::ok();
}

Status writeReals(Session &s, const PhaseInputs &inputs) {
  const at::Tensor &all = inputs.dataset();
  if (!s.isRankZero() || s.options.sampleEvery == 0 || !all.defined())
    return Status::ok();
  at::Tensor rows = all.narrow(0, 0, std::min<int64_t>(s.options.samples, all.size(0)));
  rows = rows.to(torch::kFloat);
  const std::vector<frontend::DataField> &fields = s.spec().dataFields;
  int64_t columns = 0;
  if (!fields.empty()) {
    const bool alike = std::all_of(fields.begin(), fields.end(), [&](const frontend::DataField &f) {
      return f.shape == fields.front().shape;
    });
    std::vector<at::Tensor> parts;
    for (const frontend::DataField &f : fields)
      if (alike || parts.empty())
        parts.push_back(rows.narrow(1, f.offset, f.shape[0]));
    columns = parts.size() > 1 ? static_cast<int64_t>(parts.size()) : 0;
    rows = torch::stack(parts, 1).flatten(0, 1);
  }
  return writeSampleGrid(rows, s.options.outDir + "/reals.png", columns);
}

Status writeSamples(Session &s, const PhaseInputs &inputs, int64_t step, bool last) {
  if (!s.spec().sample || !s.isRankZero())
    return Status::ok();
  const TrainOptions &o = s.options;
  // Whatever the sampler draws must not move the training streams.
  backend::ForkedRng fork(s.device);
  const std::vector<at::Tensor> in = gridInputs(s, inputs, o.samples);
  // The grid is drawn a training batch at a time (the last one filled up with the first
  // samples and trimmed): a generator traced at export runs at the batch it was traced at,
  // and each sample's image does not depend on the others'.
  const int64_t chunk = std::max<int64_t>(1, s.spec().batchSize);
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < o.samples; start += chunk)
    parts.push_back(drawBatch(s, in, start, std::min(chunk, o.samples - start)));
  at::Tensor images = torch::cat(parts); // [samples, K, ...]: K images side by side per sample
  const int64_t columns = images.size(1) > 1 ? images.size(1) : 0;
  images = images.flatten(0, 1);
  GANC_TRY(
      writeSampleGrid(images, o.outDir + "/samples_step" + std::to_string(step) + ".png", columns));
  GANC_TRY(writeSampleGrid(images, o.outDir + "/samples.png", columns));
  if (last)
    std::cout << "samples: " << std::filesystem::absolute(o.outDir + "/samples.png").string()
              << std::endl;
  return Status::ok();
}

} // namespace ganc::runtime
