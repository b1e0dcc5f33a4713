// A phase's inputs, made the way the spec says: the rank's shard of the data (staged at a
// fixed device address), labels, noise from the rank's generator, the fade-in weight.
#pragma once

#include "backend/Device.h"
#include "runtime/Session.h"
#include "runtime/data/Data.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ganc::runtime {

class PhaseInputs {
public:
  /// Loads and checks the data the spec's phases read (none if they read none) and seeds the
  /// rank's noise generator with seed + rank.
  static Expected<std::unique_ptr<PhaseInputs>> create(const Session &session);

  /// A new step: the phases that read data stage the step's next batches; the values the
  /// last step's phases handed on are dropped (with any graph they held).
  void beginStep() {
    staged_ = 0;
    values_.clear();
  }
  /// Keeps micro-batch `micro`'s values of phase `phase` (its `outputs`, from `values`) for
  /// the phases after it in this step. A value kept with its graph is taken detached by all
  /// but the phase the spec says takes it through its graph.
  void keepValues(const frontend::PhaseSpec &phase, int64_t micro,
                  const c10::impl::GenericDict &values);
  void keepValues(const frontend::PhaseSpec &phase, int64_t micro,
                  const std::map<std::string, at::Tensor> &values);
  /// Before a phase runs, outside any capture: if it reads data, stages the step's batches
  /// 0..accumulate-1 that are not staged yet (micro-batch j of every phase reads the step's
  /// batch j). Returns the images staged (0 if none).
  int64_t prepare(const frontend::PhaseSpec &phase);
  /// The phase's inputs for micro-batch `micro`, in argument order. On CUDA this runs inside
  /// the captured graph: noise is drawn anew by every replay, data and the fade weight are
  /// read at fixed addresses.
  std::vector<at::Tensor> make(const frontend::PhaseSpec &phase, int64_t micro);
  /// Sets the fade-in weight the `fade` inputs read (outside any capture).
  void setFade(double weight);

  at::Generator &noise() { return noise_; }
  /// What random ops inside phase methods draw from (the noise generator itself on CUDA).
  at::Generator &phaseRandom() { return phaseRandom_; }
  /// The seed of phaseRandom() on CPU: seed + kPhaseSeedOffset + rank (docs/spec.md).
  static constexpr uint64_t kPhaseSeedOffset = 1000003;
  /// The data set as loaded ([N, *data shape], on the CPU; undefined without data). With the
  /// spec's xflip its second half is the first mirrored.
  const at::Tensor &dataset() const { return data_; }
  /// The data set's labels, as dataset() (undefined without labels).
  const at::Tensor &labels() const { return labels_; }
  /// Samples in the data set before any mirroring.
  int64_t distinctSamples() const { return distinct_; }
  /// A digest of the data set as loaded (samples and labels; 0 without data): what the ranks
  /// compare at start-up and a checkpoint keeps.
  uint64_t dataDigest() const { return digest_; }
  /// The data order (null without data), for checkpoints.
  ShardedBatches *batches() { return batches_.get(); }

private:
  explicit PhaseInputs(const Session &session) : session_(session) {}
  const Session &session_;
  at::Tensor data_, labels_;
  int64_t distinct_ = 0;
  uint64_t digest_ = 0;
  std::unique_ptr<ShardedBatches> batches_;
  /// One staged batch (and its labels) per micro-batch index, each at a fixed address.
  std::vector<std::unique_ptr<backend::StagedBatch>> batch_, labelBatch_;
  at::Generator noise_;
  at::Generator phaseRandom_;
  at::Tensor fade_;
  /// Batches of this step staged so far.
  size_t staged_ = 0;
  /// The values phases handed on this step: by (phase, name), one per micro-batch.
  std::map<std::pair<std::string, std::string>, std::vector<at::Tensor>> values_;
};

/// A `data` input's tensor from a batch of samples (or the data set): its field, where it
/// names one, as a tensor of its own, else the samples.
at::Tensor fieldOf(const frontend::Spec &spec, const frontend::InputSpec &input,
                   const at::Tensor &samples);

} // namespace ganc::runtime
