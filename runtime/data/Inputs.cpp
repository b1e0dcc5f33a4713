// Phase inputs: sharded data, staged batches, labels, noise, the fade-in weight.
#include "runtime/data/Inputs.h"

#include "support/Hash.h"

#include <cstdio>
#include <iostream>

#include <unistd.h>

#include <algorithm>

namespace ganc::runtime {

namespace {

using frontend::InputSource;

bool readsData(const frontend::PhaseSpec &phase) {
  for (const frontend::InputSpec &in : phase.inputs)
    if (in.readsData())
      return true;
  return false;
}

/// A NaN or inf in the data (a corrupt image, values past float32's range) stops training at
/// the first step that draws it, which on a large set can be hours in: said here, before any
/// step, unless every phase that reads data skips non-finite steps (then it is a warning).
Status checkFinite(const Session &session, const std::string &path, const at::Tensor &data) {
  constexpr int64_t kChunk = 4096; // samples at a time: no copy of the whole set
  int64_t first = -1, count = 0;
  for (int64_t start = 0; start < data.size(0); start += kChunk) {
    const at::Tensor bad =
        torch::isfinite(data.narrow(0, start, std::min(kChunk, data.size(0) - start)))
            .logical_not()
            .flatten(1)
            .any(1);
    const int64_t n = bad.sum().item<int64_t>();
    if (n > 0 && first < 0)
      first = start + bad.nonzero()[0][0].item<int64_t>();
    count += n;
  }
  if (count == 0)
    return Status::ok();
  std::string stops;
  for (const frontend::PhaseSpec &p : session.spec().phases)
    if (readsData(p) && !session.skipsNonFinite(p.name))
      stops += (stops.empty() ? "'" : ", '") + p.name + "'";
  const std::string what =
      "--data " + path + ": sample " + std::to_string(first) +
      (count > 1 ? " and " + std::to_string(count - 1) + " more hold" : " holds") +
      " NaN or inf values (as " + (data.scalar_type() == at::kDouble ? "float64" : "float32") + ")";
  if (!stops.empty())
    return Status::error(what + ": phase " + stops +
                         " would stop at the first step that draws one; fix the data, or skip "
                         "such steps (--non-finite skip)");
  if (session.isRankZero())
    std::cerr << "ganc: warning: " << what << ": the steps that draw them are skipped" << std::endl;
  return Status::ok();
}

/// Every micro-batch of a step is staged at a fixed address (pinned host memory, and on CUDA
/// its device copy): `micro` batches of `shape` that would take more than half the machine's
/// memory are refused before any is allocated, not found by the OOM killer.
Status checkStagingFits(const std::string &data, const std::vector<int64_t> &shape,
                        int64_t elementSize, int64_t micro) {
  double bytes = static_cast<double>(micro) * static_cast<double>(elementSize);
  for (int64_t d : shape)
    bytes *= static_cast<double>(d);
  const double memory =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (memory <= 0 || bytes <= memory / 2)
    return Status::ok();
  char text[160];
  std::snprintf(text, sizeof(text), "%.1f GiB, more than half this machine's %.1f GiB of memory",
                bytes / (1 << 30), memory / (1 << 30));
  return Status::error("--data " + data + ": staging " + std::to_string(micro) +
                       " micro-batches of " + c10::str(c10::IntArrayRef(shape)) + " takes " + text +
                       " (lower the batch or accumulate)");
}

/// The data set's digest: its samples' and labels' shapes, types and bytes, as loaded.
uint64_t digestOf(const Dataset &data) {
  uint64_t h = kDigestStart;
  for (const at::Tensor &t : {data.samples, data.labels}) {
    if (!t.defined())
      continue;
    const at::Tensor whole = t.contiguous();
    const std::vector<int64_t> shape = whole.sizes().vec();
    const auto type = static_cast<int64_t>(whole.scalar_type());
    h = digestWords(h, &type, sizeof(type));
    h = digestWords(h, shape.data(), shape.size() * sizeof(int64_t));
    h = digestWords(h, whole.data_ptr(), whole.nbytes());
  }
  return h;
}

} // namespace

at::Tensor fieldOf(const frontend::Spec &spec, const frontend::InputSpec &input,
                   const at::Tensor &samples) {
  const frontend::DataField *field = input.field.empty() ? nullptr : spec.dataField(input.field);
  if (field == nullptr)
    return samples;
  // A copy in the samples' memory format (channels-last on CUDA), not a strided view.
  const auto format = samples.dim() == 4 && samples.is_contiguous(at::MemoryFormat::ChannelsLast)
                          ? at::MemoryFormat::ChannelsLast
                          : at::MemoryFormat::Contiguous;
  return samples.narrow(1, field->offset, field->shape[0]).contiguous(format);
}

Expected<std::unique_ptr<PhaseInputs>> PhaseInputs::create(const Session &session) {
  auto in = std::unique_ptr<PhaseInputs>(new PhaseInputs(session));
  const frontend::Spec &spec = session.spec();
  const TrainOptions &o = session.options;
  if (spec.stages)
    in->fade_ = torch::ones({}, at::TensorOptions(session.device).dtype(session.inputType));
  bool needsData = false, needsLabels = false;
  for (const frontend::PhaseSpec &p : spec.phases) {
    needsData |= readsData(p);
    for (const frontend::InputSpec &in : p.inputs)
      needsLabels |= in.source == InputSource::Labels;
  }
  if (needsData) {
    if (o.data.empty())
      return Status::error("the spec's phases read data: give --data PATH (a torch.save "
                           "tensor file or a folder of images)");
    auto data = loadDataset(o.data, spec.dataShape, dataLayout(spec));
    if (!data)
      return data.status();
    in->distinct_ = data->samples.size(0);
    in->digest_ = digestOf(*data);
    if (spec.dataXflip) { // the set doubled: every image also mirrored left to right
      data->samples = torch::cat({data->samples, data->samples.flip({-1})});
      if (data->labels.defined())
        data->labels = torch::cat({data->labels, data->labels});
    }
    in->data_ = data->samples.to(session.inputType);
    in->labels_ = data->labels;
    if (!data->decoded)
      GANC_TRY(checkFinite(session, o.data, in->data_));
    if (session.isRankZero() && !data->note.empty())
      std::cout << "data: " << data->note << std::endl;
    if (session.isRankZero() && !data->warning.empty())
      std::cerr << "ganc: warning: " << data->warning << std::endl;
    if (needsLabels && !in->labels_.defined())
      return Status::error("--data " + o.data +
                           ": the spec's phases read labels, and the data "
                           "has none (save {'images': ..., 'labels': ...}, put the images in "
                           "one folder per class, or label them in dataset.json)");
    if (needsLabels) {
      int64_t top = in->labels_.max().item<int64_t>(), bottom = in->labels_.min().item<int64_t>();
      if (bottom < 0 || top >= spec.dataClasses)
        return Status::error("--data " + o.data + ": labels span " + std::to_string(bottom) + ".." +
                             std::to_string(top) + ", the spec declares " +
                             std::to_string(spec.dataClasses) + " classes");
    }
    in->batches_ = std::make_unique<ShardedBatches>(in->data_.size(0), session.rank.rank,
                                                    session.rank.worldSize, spec.batchSize, o.seed);
    if (in->batches_->batchesPerEpoch() == 0)
      return Status::error("--data " + o.data + ": " + std::to_string(in->data_.size(0)) +
                           (in->data_.size(0) == 1 ? " sample is" : " samples are") +
                           " too few for " + std::to_string(session.rank.worldSize) +
                           (session.rank.worldSize == 1 ? " rank" : " ranks") + " of batch " +
                           std::to_string(spec.batchSize));
    std::vector<int64_t> shape = {spec.batchSize};
    shape.insert(shape.end(), spec.dataShape.begin(), spec.dataShape.end());
    int64_t micro = 1;
    for (const frontend::PhaseSpec &p : spec.phases)
      if (readsData(p))
        micro = std::max(micro, session.recipe(p).accumulate);
    GANC_TRY(checkStagingFits(o.data, shape, in->data_.element_size(), micro));
    const bool copyStream = session.options.uploadStream == UploadStream::Copy;
    for (int64_t j = 0; j < micro; ++j) {
      in->batch_.push_back(std::make_unique<backend::StagedBatch>(
          shape, in->data_.scalar_type(), session.device, session.channelsLast, copyStream));
      if (needsLabels)
        in->labelBatch_.push_back(std::make_unique<backend::StagedBatch>(
            std::vector<int64_t>{spec.batchSize}, torch::kLong, session.device, false, copyStream));
    }
  }
  const auto rank = static_cast<uint64_t>(session.rank.rank);
  in->noise_ = backend::noiseGenerator(session.device, o.seed + rank);
  in->phaseRandom_ =
      session.device.is_cuda()
          ? in->noise_
          : backend::phaseGenerator(session.device, o.seed + kPhaseSeedOffset + rank);
  return in;
}

int64_t PhaseInputs::prepare(const frontend::PhaseSpec &phase) {
  if (!readsData(phase))
    return 0;
  int64_t images = 0;
  for (; staged_ < static_cast<size_t>(session_.recipe(phase).accumulate); ++staged_) {
    at::Tensor indices = batches_->next();
    batch_[staged_]->stage(data_, indices);
    if (!labelBatch_.empty())
      labelBatch_[staged_]->stage(labels_, indices);
    images += session_.spec().batchSize; // this rank's: Progress counts every rank's
  }
  return images;
}

std::vector<at::Tensor> PhaseInputs::make(const frontend::PhaseSpec &phase, int64_t micro) {
  const auto j = static_cast<size_t>(micro);
  const int64_t batch = session_.spec().batchSize;
  std::vector<at::Tensor> inputs;
  for (const frontend::InputSpec &in : phase.inputs) {
    switch (in.source) {
    case InputSource::Data:
      inputs.push_back(fieldOf(session_.spec(), in, batch_.at(j)->tensor()));
      break;
    case InputSource::Fade:
      inputs.push_back(fade_);
      break;
    case InputSource::Controller:
      inputs.push_back(session_.controllers.at(in.controller).value());
      break;
    case InputSource::Output: {
      const at::Tensor &value = values_.at({in.producer, in.value}).at(j);
      inputs.push_back(in.detach ? value.detach() : value);
      break;
    }
    case InputSource::Labels:
      inputs.push_back(labelBatch_.at(j)->tensor());
      break;
    case InputSource::Categorical:
      inputs.push_back(torch::randint(in.classes, {batch}, noise_,
                                      at::TensorOptions(session_.device).dtype(torch::kLong)));
      break;
    case InputSource::Normal:
    case InputSource::Uniform: {
      // Drawn in float32 and cast, like the eager reference.
      std::vector<int64_t> shape = {batch};
      shape.insert(shape.end(), in.shape.begin(), in.shape.end());
      at::TensorOptions options(session_.device);
      inputs.push_back((in.source == InputSource::Uniform ? torch::rand(shape, noise_, options)
                                                          : torch::randn(shape, noise_, options))
                           .to(session_.inputType));
      break;
    }
    }
  }
  return inputs;
}

void PhaseInputs::keepValues(const frontend::PhaseSpec &phase, int64_t micro,
                             const c10::impl::GenericDict &values) {
  std::map<std::string, at::Tensor> named;
  for (const std::string &name : phase.outputs)
    named[name] = values.at(name).toTensor();
  keepValues(phase, micro, named);
}

void PhaseInputs::keepValues(const frontend::PhaseSpec &phase, int64_t micro,
                             const std::map<std::string, at::Tensor> &values) {
  for (const std::string &name : phase.outputs) {
    std::vector<at::Tensor> &kept = values_[{phase.name, name}];
    kept.resize(static_cast<size_t>(micro) + 1);
    kept[static_cast<size_t>(micro)] = values.at(name);
  }
}

void PhaseInputs::setFade(double weight) {
  torch::NoGradGuard noGrad;
  fade_.fill_(weight);
}

} // namespace ganc::runtime
