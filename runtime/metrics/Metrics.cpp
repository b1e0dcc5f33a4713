// FID and KID during training: images and features across the ranks, the real features'
// cache, the feature network.
#include "runtime/metrics/Metrics.h"

#include "backend/Device.h"
#include "runtime/metrics/MetricMath.h"
#include "runtime/rundir/Samples.h"
#include "runtime/rundir/Stop.h"
#include "support/Files.h"
#include "support/Hash.h"
#include "support/torch/Collectives.h"
#include "support/torch/TorchError.h"

#include <torch/serialize.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <regex>

namespace ganc::runtime {

namespace fs = std::filesystem;

namespace {

/// The noise of the metrics' images: block b of them is drawn from a generator seeded with
/// kNoiseSeed + b, so the images do not depend on the number of ranks or on training's
/// streams.
constexpr uint64_t kNoiseSeed = 0x6a09e667;

/// One value from rank 0 to every rank (the others pass anything): a sum in which only
/// rank 0's counts.
at::Tensor fromRankZero(Session &s, at::Tensor values) {
  if (s.rank.worldSize == 1)
    return values;
  at::Tensor t = (s.isRankZero() ? values : torch::zeros_like(values)).to(s.device);
  std::vector<at::Tensor> tensors{t};
  waitFor(s.group.backend->allreduce(tensors));
  return t.cpu();
}

std::string hex(uint64_t key) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(key));
  return text;
}

/// With `buffers: local` every rank keeps its own BatchNorm statistics: for as long as the scope
/// lasts the generator holds rank 0's (what checkpoints keep), so that the images do not depend
/// on which rank made them; each rank's own come back after.
class RankZeroBuffers {
public:
  RankZeroBuffers(Session &s, torch::jit::Module generator) {
    if (s.rank.worldSize == 1 || s.spec().buffers != "local")
      return;
    torch::NoGradGuard noGrad;
    for (const auto &b : generator.named_buffers(true)) {
      own_.push_back(b.value.detach().clone());
      buffers_.push_back(b.value.detach());
      std::vector<at::Tensor> tensors{b.value.detach()};
      waitFor(s.group.backend->broadcast(tensors));
    }
  }
  ~RankZeroBuffers() {
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < buffers_.size(); ++i)
      buffers_[i].copy_(own_[i]);
  }
  RankZeroBuffers(const RankZeroBuffers &) = delete;
  RankZeroBuffers &operator=(const RankZeroBuffers &) = delete;

private:
  std::vector<at::Tensor> buffers_, own_;
};

} // namespace

Expected<MetricSpec> parseMetric(const std::string &name) {
  static const std::regex pattern(R"((fid|kid)([0-9]{1,9})(k?)(_full)?)");
  std::smatch m;
  if (!std::regex_match(name, m, pattern))
    return Status::error("--metrics: '" + name +
                         "' is not a metric: fidN or kidN with N images generated (fid50k, "
                         "kid10k, fid2000), _full to compare with the whole data set "
                         "(fid50k_full)");
  MetricSpec spec;
  spec.name = name;
  spec.kid = m[1] == "kid";
  spec.generated = std::stoll(m[2]) * (m[3].length() ? 1000 : 1);
  spec.full = m[4].length() > 0;
  if (spec.generated < 2 || spec.generated > 100000000)
    return Status::error("--metrics " + name + ": images from 2 to 100000k, not " +
                         std::to_string(spec.generated));
  return spec;
}

std::string defaultInceptionPath() {
  if (const char *path = std::getenv("GANC_INCEPTION"); path && *path)
    return path;
  std::string cache;
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    cache = xdg;
  else if (const char *home = std::getenv("HOME"); home && *home)
    cache = std::string(home) + "/.cache";
  else
    cache = ".cache";
  return cache + "/ganc/inception-2015-12-05.pt";
}

Expected<std::unique_ptr<Metrics>> Metrics::create(Session &s, const PhaseInputs &inputs) {
  const TrainOptions &o = s.options;
  if (o.metrics.empty())
    return std::unique_ptr<Metrics>();
  auto m = std::unique_ptr<Metrics>(new Metrics(s, inputs));
  for (const std::string &name : o.metrics) {
    auto spec = parseMetric(name);
    if (!spec)
      return spec.status();
    for (const MetricSpec &other : m->metrics_)
      if (other.name == name)
        return Status::error("--metrics names " + name + " twice");
    m->metrics_.push_back(*spec);
  }
  const frontend::Spec &spec = s.spec();
  if (!spec.sample)
    return Status::error("--metrics: the spec's `sample` is missing; the metrics score a "
                         "generator on noise (spec `sample`: submodule, noise_shape)");
  // A method (StyleGAN's G(z, c) through its loss's sample_grid) is called on noise and class
  // ids, as NVIDIA's metrics call G(z, c).
  for (const frontend::InputSpec &input : spec.sample->inputs)
    if (input.source != frontend::InputSource::Normal &&
        input.source != frontend::InputSource::Uniform &&
        input.source != frontend::InputSource::Categorical)
      return Status::error("--metrics: the spec's `sample` method '" + spec.sample->method +
                           "' takes '" + input.name +
                           "' from the data; the metrics call it on noise and class ids only");
  if (!inputs.dataset().defined())
    return Status::error("--metrics compares with the real images: the spec's phases read no "
                         "data (--data)");
  if (spec.dataFields.size() > 1)
    return Status::error("--metrics compares with the real images: the spec's samples have " +
                         std::to_string(spec.dataFields.size()) +
                         " fields (data.fields), not one image each");
  if (spec.dataShape.size() != 3 || (spec.dataShape[0] != 1 && spec.dataShape[0] != 3))
    return Status::error("--metrics scores images: the spec's data shape must be [C, H, W] with "
                         "C = 1 or 3, not " +
                         c10::str(c10::IntArrayRef(spec.dataShape)));
  m->method_ = spec.sample->method;
  if (m->method_.empty())
    m->generator_ = spec.ema && spec.ema->submodule == spec.sample->submodule
                        ? spec.ema->copy
                        : spec.sample->submodule;
  m->everyImages_ = o.metricsEveryKimg * 1000;
  GANC_TRY(m->load(o.inception.empty() ? defaultInceptionPath() : o.inception));
  m->warnSmallSets();
  char network[17];
  std::snprintf(network, sizeof(network), "%016llx",
                static_cast<unsigned long long>(
                    digestWords(kDigestStart, m->networkBytes_.data(), m->networkBytes_.size())));
  if (!s.best.metric.empty() && s.best.metric != m->ranking()) {
    if (s.isRankZero())
      std::cout << "metrics: the checkpoint's best snapshot was ranked by " << s.best.metric
                << "; this run ranks by " << m->ranking() << " from here" << std::endl;
    s.best = Session::Best();
  } else if (s.best.step >= 0 && !s.best.network.empty() && s.best.network != network) {
    if (s.isRankZero())
      std::cout << "metrics: the checkpoint's best snapshot was scored by another feature network "
                   "than --inception "
                << m->networkPath_ << "; snapshots rank by this network's scores from here"
                << std::endl;
    s.best = Session::Best();
  }
  s.best.metric = m->ranking();
  s.best.network = network;
  return m;
}

void Metrics::warnSmallSets() const {
  if (!s_.isRankZero())
    return;
  for (const MetricSpec &metric : metrics_) {
    const int64_t distinct = inputs_.distinctSamples();
    const int64_t real = metric.full ? distinct : std::min(distinct, metric.generated);
    const int64_t fewest = std::min(real, metric.generated);
    if (metric.kid || fewest >= featureSize_)
      continue;
    std::cerr << "ganc: warning: --metrics " << metric.name << ": "
              << (real <= metric.generated ? std::to_string(real) + " real"
                                           : std::to_string(metric.generated) + " generated")
              << " images, fewer than the network's " << featureSize_
              << " features: their covariance is singular and FID is not well defined there "
                 "(scores are comparable only with the same count; KID is defined)"
              << std::endl;
  }
}

Status Metrics::load(const std::string &path) {
  networkPath_ = path;
  if (!fs::exists(path))
    return Status::error(
        "--metrics needs the Inception network (inception-2015-12-05.pt), and " + path +
        " does not exist: put the file there or give --inception PATH; NVIDIA publishes it at " +
        kInceptionUrl);
  auto bytes = readFile(path);
  if (!bytes)
    return bytes.status().withContext("--inception");
  networkBytes_ = bytes.take();
  try {
    network_ = torch::jit::load(path, s_.device);
    network_.eval();
  } catch (const std::exception &e) {
    return Status::error("--inception " + path + ": not a TorchScript file (" + firstLine(e) + ")");
  }
  // One batch through the generator and the network: both are checked before training.
  backend::ForkedRng fork(s_.device);
  at::Tensor pixels;
  try {
    pixels = generateBlock(0);
  } catch (const std::exception &e) {
    return Status::error("--metrics: the generator " + generatorName() +
                         " did not make images of [B, 1 or 3, H, W]: " + firstLine(e));
  }
  at::Tensor features;
  try {
    features = embed(pixels);
  } catch (const std::exception &e) {
    return Status::error("--inception " + path + ": " + firstLine(e) +
                         " (a feature network takes uint8 images [N, 3, H, W] and "
                         "return_features=True, and returns features [N, F])");
  }
  featureSize_ = features.size(1);
  return Status::ok();
}

at::Tensor Metrics::toPixels(const at::Tensor &images) {
  TORCH_CHECK(images.dim() == 4 && (images.size(1) == 1 || images.size(1) == 3), "it returned ",
              images.sizes());
  at::Tensor pixels = images.to(at::kFloat).mul(127.5).add(128).clamp(0, 255).to(at::kByte);
  return pixels.size(1) == 1 ? pixels.expand({-1, 3, -1, -1}).contiguous() : pixels.contiguous();
}

std::string Metrics::generatorName() const {
  return method_.empty() ? "'" + generator_ + "'" : "method '" + method_ + "'";
}

torch::jit::Module Metrics::generatorModule() const {
  return method_.empty() ? s_.module().attr(generator_).toModule() : s_.module();
}

at::Tensor Metrics::generateBlock(int64_t block) {
  const frontend::SampleSpec &sample = *s_.spec().sample;
  const int64_t batch = std::max<int64_t>(1, s_.spec().batchSize);
  auto random = at::detail::createCPUGenerator(kNoiseSeed + static_cast<uint64_t>(block));
  auto noise = [&](const std::vector<int64_t> &dims, bool uniform) {
    std::vector<int64_t> shape = {batch};
    shape.insert(shape.end(), dims.begin(), dims.end());
    at::Tensor z = uniform ? torch::rand(shape, random) : torch::randn(shape, random);
    return z.to(s_.inputType).to(s_.device);
  };
  std::vector<c10::IValue> args;
  if (method_.empty()) {
    args.emplace_back(noise(sample.noiseShape, false));
    if (sample.classes > 0)
      args.emplace_back(
          (torch::arange(block * batch, (block + 1) * batch, torch::kLong) % sample.classes)
              .to(s_.device));
  }
  for (const frontend::InputSpec &input : sample.inputs) {
    if (input.source != frontend::InputSource::Categorical) {
      args.emplace_back(noise(input.shape, input.source == frontend::InputSource::Uniform));
      continue;
    }
    // Class ids as NVIDIA's metrics draw c: the labels of random samples of the data set
    // (its class frequencies), else uniform over the classes.
    const at::Tensor &labels = inputs_.labels();
    at::Tensor ids =
        labels.defined() && labels.size(0) > 0
            ? labels.index_select(0, torch::randint(labels.size(0), {batch}, random, torch::kLong))
            : torch::randint(input.classes, {batch}, random, torch::kLong);
    args.emplace_back(ids.to(torch::kLong).to(s_.device));
  }
  torch::jit::Module generator = generatorModule();
  torch::NoGradGuard noGrad;
  generator.eval();
  c10::IValue out = s_.sampler        ? runSampler(s_, args)
                    : method_.empty() ? generator.forward(args)
                                      : generator.get_method(method_)(args);
  generator.train();
  TORCH_CHECK(out.isTensor(), "it returned a ", out.tagKind(), ", not one batch of images");
  return toPixels(out.toTensor());
}

at::Tensor Metrics::embed(const at::Tensor &pixels) {
  torch::NoGradGuard noGrad;
  c10::IValue out = network_.get_method("forward")({pixels}, {{"return_features", true}});
  TORCH_CHECK(out.isTensor(), "it returned a ", out.tagKind(), ", not a tensor");
  at::Tensor features = out.toTensor();
  TORCH_CHECK(features.dim() == 2 && features.size(0) == pixels.size(0), "it returned ",
              features.sizes(), " for ", pixels.size(0), " images");
  TORCH_CHECK(features.is_floating_point(), "it returned ", features.dtype().name(),
              " features (FID's moments need floating-point features)");
  return features.to(at::kFloat).contiguous();
}

at::Tensor Metrics::embedAcrossRanks(int64_t count,
                                     const std::function<at::Tensor(int64_t)> &block) {
  const int world = s_.rank.worldSize;
  const int64_t batch = std::max<int64_t>(1, s_.spec().batchSize);
  const int64_t blocks = (count + batch - 1) / batch;
  std::vector<at::Tensor> kept;
  for (int64_t first = 0; first < blocks; first += world) {
    if ((abandonedBy_ = stopCheck_ ? agreedStopNow(s_) : 0))
      return at::Tensor();
    const int64_t mine = first + s_.rank.rank;
    at::Tensor features = mine < blocks
                              ? embed(block(mine))
                              : torch::zeros({batch, featureSize_}, at::TensorOptions(s_.device));
    if (world == 1) {
      kept.push_back(features);
      continue;
    }
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int q = 0; q < world; ++q)
      gathered[0].push_back(torch::empty_like(features));
    std::vector<at::Tensor> input{features};
    waitFor(s_.group.backend->allgather(gathered, input));
    for (int q = 0; q < world && first + q < blocks; ++q)
      kept.push_back(gathered[0][q]);
  }
  if (!s_.isRankZero())
    return at::Tensor();
  return torch::cat(kept).narrow(0, 0, count);
}

namespace {

/// Whether every feature is finite (rank 0 holds them; elsewhere: true).
bool finite(const at::Tensor &features) {
  return !features.defined() || features.isfinite().all().item<bool>();
}

} // namespace

std::string Metrics::cachePath(const at::Tensor &data) const {
  uint64_t key = digestWords(kDigestStart, "ganc real features 1", 20);
  key = digestWords(key, data.data_ptr(), data.nbytes());
  key = digestWords(key, data.sizes().data(), data.dim() * sizeof(int64_t));
  key = digestWords(key, networkBytes_.data(), networkBytes_.size());
  std::string beside = s_.options.data;
  while (beside.size() > 1 && beside.back() == '/')
    beside.pop_back();
  return beside + ".ganc-cache/real-features-" + hex(key) + ".pt";
}

Status Metrics::notFinite(const std::string &what) const {
  return Status::failure("metrics: the feature network " + networkPath_ +
                         " gave NaN or inf features for " + what +
                         "; no score is kept (check the network file, or --inception)");
}

Expected<at::Tensor> Metrics::realFeatures(int64_t count) {
  if (auto found = realCache_.find(count); found != realCache_.end())
    return found->second;
  const at::Tensor data = inputs_.dataset().narrow(0, 0, count).contiguous();
  const std::string path = cachePath(data); // on every rank: each names it alike
  at::Tensor cached;
  if (s_.isRankZero()) {
    if (auto bytes = readFile(path); bytes && checkZipArchive(*bytes)) {
      try {
        cached = torch::pickle_load(*bytes).toTensor();
      } catch (const std::exception &) {
      }
      if (cached.defined() && cached.sizes().vec() != std::vector<int64_t>{count, featureSize_})
        cached = at::Tensor();
    }
  }
  // 1: cached, 0: not, -1: cached with NaN or inf values (from rank 0, for every rank).
  const double found = !cached.defined() ? 0.0 : finite(cached) ? 1.0 : -1.0;
  const double hit = fromRankZero(s_, torch::tensor({found}, at::kDouble)).item<double>();
  if (hit < 0)
    return Status::failure("metrics: the cached real features " + path +
                           " hold NaN or inf values; delete the file (it is computed again)");
  if (hit > 0) {
    if (s_.isRankZero())
      std::cout << "metrics: the real images' features: " << path << std::endl;
    return realCache_[count] = s_.isRankZero() ? cached.to(s_.device) : at::Tensor();
  }
  if (s_.isRankZero())
    std::cout << "metrics: embedding " << count << " real images (cached next time in " << path
              << ")" << std::endl;
  const int64_t batch = std::max<int64_t>(1, s_.spec().batchSize);
  at::Tensor features = embedAcrossRanks(count, [&](int64_t block) {
    at::Tensor rows = torch::arange(block * batch, (block + 1) * batch, torch::kLong) % count;
    return toPixels(data.index_select(0, rows).to(s_.device));
  });
  if (abandonedBy_)
    return at::Tensor(); // nothing cached
  if (fromRankZero(s_, torch::tensor({finite(features) ? 1.0 : 0.0}, at::kDouble)).item<double>() ==
      0)
    return notFinite("the real images"); // and nothing cached
  if (s_.isRankZero()) {
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    Status stored = writeFileAtomically(path, torch::pickle_save(features.cpu()));
    if (!stored)
      std::cerr << "ganc: warning: the real images' features are not cached (" << stored.message()
                << "): they are computed again next run" << std::endl;
  }
  return realCache_[count] = features; // every rank notes the count: none asks rank 0 again
}

bool Metrics::due(int64_t before, int64_t after, bool last) const {
  if (last)
    return true;
  if (everyImages_ <= 0)
    return false;
  return std::floor(static_cast<double>(after) / everyImages_) >
         std::floor(static_cast<double>(before) / everyImages_);
}

Expected<std::vector<std::pair<std::string, double>>> Metrics::evaluate(int64_t step) {
  backend::ForkedRng fork(s_.device);
  RankZeroBuffers buffers(s_, generatorModule());
  std::map<int64_t, at::Tensor> generated; // by count: fid50k and kid50k share their images
  std::map<std::string, at::Tensor> dumped;
  std::vector<double> values;
  bool generatedFinite = true;
  abandonedBy_ = 0;
  stopCheck_ = true;
  for (const MetricSpec &metric : metrics_) {
    const int64_t distinct = inputs_.distinctSamples();
    auto real = realFeatures(metric.full ? distinct : std::min(distinct, metric.generated));
    if (!real || abandonedBy_)
      return real ? Status::failure("metrics abandoned") : real.status();
    if (!generated.count(metric.generated))
      generated[metric.generated] = embedAcrossRanks(
          metric.generated, [this](int64_t block) { return generateBlock(block); });
    if (abandonedBy_)
      return Status::failure("metrics abandoned");
    const at::Tensor &fake = generated.at(metric.generated);
    double value = 0;
    if (!finite(fake)) {
      value = std::nan(""); // rank 0 says so below, with every rank
      generatedFinite = false;
    } else if (s_.isRankZero()) {
      if (!realMoments_.count(real->size(0)))
        realMoments_[real->size(0)] = featureMoments(*real);
      value = metric.kid ? kernelInceptionDistance(fake, *real)
                         : frechetDistance(featureMoments(fake), realMoments_.at(real->size(0)));
      if (!s_.options.dumpDir.empty()) { // parity tests read the features back
        dumped[metric.name + "/generated"] = fake.cpu();
        dumped[metric.name + "/real"] = real->cpu();
      }
    }
    values.push_back(value);
  }
  values.push_back(generatedFinite ? 1.0 : 0.0);
  at::Tensor shared = fromRankZero(s_, torch::tensor(values, at::kDouble));
  if (shared[static_cast<int64_t>(metrics_.size())].item<double>() == 0)
    return notFinite("the generated images of " + generatorName());
  std::vector<std::pair<std::string, double>> result;
  for (size_t i = 0; i < metrics_.size(); ++i)
    result.emplace_back(metrics_[i].name, shared[static_cast<int64_t>(i)].item<double>());
  if (!s_.options.dumpDir.empty() && s_.isRankZero()) {
    c10::Dict<std::string, at::Tensor> features;
    for (const auto &[name, t] : dumped)
      features.insert(name, t);
    GANC_TRY(
        writeFileAtomically(s_.options.dumpDir + "/metrics_step" + std::to_string(step) + ".pt",
                            torch::pickle_save(features)));
  }
  return result;
}

} // namespace ganc::runtime
