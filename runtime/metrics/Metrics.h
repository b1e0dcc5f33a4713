// Quality metrics during training (--metrics fid50k,kid50k): every rank generates and embeds
// its share of the images with the Inception network StyleGAN uses, rank 0 computes FID and
// KID from the gathered features; the real images' features are computed once per data set
// and cached beside it.
#pragma once

#include "runtime/Session.h"
#include "runtime/data/Inputs.h"
#include "runtime/metrics/MetricMath.h"

#include <torch/script.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ganc::runtime {

/// One entry of --metrics: `fid50k`, `kid10k`, `fid2000`, `fid50k_full`.
struct MetricSpec {
  std::string name;
  bool kid = false;
  /// Images generated.
  int64_t generated = 0;
  /// Real images: the data set's first `generated` (StyleGAN's fid50k), or all of it (_full).
  bool full = false;
};

/// Parses one --metrics name; the error says what a name looks like.
Expected<MetricSpec> parseMetric(const std::string &name);

/// Where the Inception network is looked for without --inception:
/// $GANC_INCEPTION, else ${XDG_CACHE_HOME:-~/.cache}/ganc/inception-2015-12-05.pt.
std::string defaultInceptionPath();

/// Where NVIDIA publishes the network (StyleGAN2-ADA's metrics, clean-fid).
inline constexpr const char *kInceptionUrl =
    "https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/"
    "inception-2015-12-05.pt";

/// The metrics of one run: the feature network, the generator it scores, the real features.
class Metrics {
public:
  /// Null when options.metrics is empty. Checked before training, on every rank: the names,
  /// the spec's sample generator (G_ema where the spec keeps one), the data set, and the
  /// network, loaded and run on one generated batch.
  static Expected<std::unique_ptr<Metrics>> create(Session &session, const PhaseInputs &inputs);

  /// Whether the step that took the images seen from `before` to `after` ends a
  /// --metrics-every interval (or is the run's last).
  bool due(int64_t before, int64_t after, bool last) const;

  /// Every rank takes part: the real features (cached, else computed across the ranks),
  /// each metric's images generated and embedded across the ranks; rank 0 computes. Every
  /// rank gets the values, in --metrics order.
  Expected<std::vector<std::pair<std::string, double>>> evaluate(int64_t step);

  /// The metric that ranks snapshots (the first of --metrics; lower is better).
  const std::string &ranking() const { return metrics_.front().name; }
  /// The signal (SIGINT or SIGTERM) that made the last evaluate() stop part way, or 0: the ranks
  /// agree on a stop before each block of images, so that a long evaluation never outlasts a
  /// scheduler's or the launcher's grace; nothing of it is kept.
  int abandonedBy() const { return abandonedBy_; }

private:
  Metrics(Session &session, const PhaseInputs &inputs) : s_(session), inputs_(inputs) {}
  Status load(const std::string &path);
  int abandonedBy_ = 0;
  /// Whether embedAcrossRanks checks for a stop: in evaluate(), not in the start-up check.
  bool stopCheck_ = false;
  /// Rank 0 warns of an FID over fewer images than the network has features.
  void warnSmallSets() const;
  /// Where the features of the real images `data` are cached: beside --data, keyed by the
  /// images and the network's bytes.
  std::string cachePath(const at::Tensor &data) const;
  /// The failure of features that are not finite: naming the network and `what` it embedded.
  Status notFinite(const std::string &what) const;
  /// uint8 [B, 3, H, W] on the device from images in [-1, 1] ([B, 1 or 3, H, W]).
  static at::Tensor toPixels(const at::Tensor &images);
  /// The generator's block `block` (a training batch of images) as pixels.
  at::Tensor generateBlock(int64_t block);
  /// `count` images' features, in blocks dealt to the ranks in turn (every rank takes part);
  /// the whole set on rank 0, an empty tensor elsewhere.
  at::Tensor embedAcrossRanks(int64_t count, const std::function<at::Tensor(int64_t)> &block);
  /// The features of the data set's first `count` images: from the cache beside the data, or
  /// computed across the ranks and cached (rank 0 decides, every rank follows).
  Expected<at::Tensor> realFeatures(int64_t count);
  at::Tensor embed(const at::Tensor &pixels);
  /// What makes the images, for messages: 'G_ema' or method 'sample_grid'.
  std::string generatorName() const;
  /// The module whose buffers and mode the generation touches.
  torch::jit::Module generatorModule() const;

  Session &s_;
  const PhaseInputs &inputs_;
  std::vector<MetricSpec> metrics_;
  std::string networkPath_;
  std::vector<char> networkBytes_;
  torch::jit::Module network_;
  int64_t featureSize_ = 0;
  /// The submodule the metrics call on noise (the EMA copy where it has one), or "" where the
  /// spec's `sample` is a method of the GAN (`method_`), called on noise and class ids.
  std::string generator_;
  std::string method_;
  double everyImages_ = 0;
  /// The real features (rank 0's; undefined elsewhere) and their moments by image count: the
  /// data do not change during a run.
  std::map<int64_t, at::Tensor> realCache_;
  std::map<int64_t, FeatureMoments> realMoments_;
};

} // namespace ganc::runtime
