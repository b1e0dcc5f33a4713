// Training data: a tensor file or a folder of images, sharded by rank like DistributedSampler.
#pragma once

#include "frontend/Spec.h"
#include "support/Status.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace ganc::runtime {

/// Training samples and, where the set has them, their class labels.
struct Dataset {
  at::Tensor samples; // [N, *sampleShape], float32 (float64 where a tensor file holds float64)
  at::Tensor labels;  // [N], int64; undefined when unlabelled
  /// What was found, for rank 0 to say once ("10 classes from folder names: ...").
  std::string note;
  /// Something that looks wrong but is not an error (values in [0, 1], not [-1, 1]).
  std::string warning;
  /// Decoded from 8-bit images: finite by construction (a tensor file may hold NaN or inf).
  bool decoded = false;
};

/// Loads samples of `sampleShape` from `path`: a file written by torch.save (a tensor of shape
/// [N, *sampleShape], or a dict with an "images" tensor and optionally a "labels" tensor), or
/// PNG/JPEG images (decoded, resized to the sample shape, scaled to [-1, 1]) in a folder, its
/// subfolders, or a zip archive. Images are labelled by StyleGAN's dataset.json
/// ({"labels": [["path/in/set.png", class], ...]}) where there is one, else, where every image
/// lies in a first-level subfolder, by that folder's name (torchvision's ImageFolder: classes
/// in sorted order); otherwise they are unlabelled.
Expected<Dataset> loadDataset(const std::string &path, const std::vector<int64_t> &sampleShape);

/// How the spec's samples are made of fields (`data.fields`, `data.layout`).
struct DataLayout {
  std::vector<frontend::DataField> fields;
  /// Each image holds the fields left to right (pix2pix's A|B images).
  bool sideBySide = false;
};
/// As above; with fields, a tensor file is a dict with a tensor per field (and optionally
/// "labels"), and images are split side by side where the layout says so. The samples hold
/// the fields packed along dimension 1, in the spec's order.
Expected<Dataset> loadDataset(const std::string &path, const std::vector<int64_t> &sampleShape,
                              const DataLayout &layout);
/// The spec's data layout.
DataLayout dataLayout(const frontend::Spec &spec);

/// torch.utils.data.DistributedSampler(shuffle=True, seed, drop_last=False) feeding a
/// DataLoader(batch_size, drop_last=True): the same indices, in the same order, per rank.
class ShardedBatches {
public:
  ShardedBatches(int64_t datasetSize, int rank, int worldSize, int64_t batchSize, uint64_t seed);
  /// Batches per epoch on every rank; 0 when the dataset is too small.
  int64_t batchesPerEpoch() const { return numSamples_ / batchSize_; }
  /// The indices of the next batch (advancing to the next epoch when one is used up).
  at::Tensor next();
  int64_t epoch() const { return epoch_; }
  /// Samples in the whole dataset.
  int64_t datasetSize() const { return size_; }
  int64_t cursor() const { return cursor_; }
  /// Continues from a saved position (epoch, batches already taken in it).
  void seek(int64_t epoch, int64_t cursor);

private:
  void startEpoch();
  int64_t size_, numSamples_, batchSize_;
  int rank_, world_;
  uint64_t seed_;
  int64_t epoch_ = 0, cursor_ = 0;
  at::Tensor indices_;
};

} // namespace ganc::runtime
