// Dataset loading (torch.save files, image folders through stb_image) and rank sharding.
#include "runtime/Data.h"

#include "ir/Files.h"

#include <torch/serialize.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#include <stb/stb_image.h>

namespace ganc::runtime {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

Expected<at::Tensor> loadImageFolder(const std::string &dir, const std::vector<int64_t> &shape) {
  if (shape.size() != 3 || (shape[0] != 1 && shape[0] != 3))
    return Status::error("--data " + dir +
                         ": a folder of images needs a [C, H, W] data shape "
                         "with C = 1 or 3 in the spec");
  std::vector<fs::path> files;
  for (const auto &entry : fs::directory_iterator(dir)) {
    std::string ext = lower(entry.path().extension().string());
    if (entry.is_regular_file() && (ext == ".png" || ext == ".jpg" || ext == ".jpeg"))
      files.push_back(entry.path());
  }
  if (files.empty())
    return Status::error("--data " + dir + ": no PNG or JPEG images in the folder");
  std::sort(files.begin(), files.end());
  const int channels = static_cast<int>(shape[0]);
  std::vector<at::Tensor> images;
  for (const fs::path &file : files) {
    int w = 0, h = 0, n = 0;
    unsigned char *pixels = stbi_load(file.c_str(), &w, &h, &n, channels);
    if (!pixels)
      return Status::error(file.string() + ": cannot decode image (" + stbi_failure_reason() + ")");
    at::Tensor img = torch::from_blob(pixels, {h, w, channels}, torch::kUInt8)
                         .permute({2, 0, 1})
                         .to(torch::kFloat32)
                         .unsqueeze(0);
    stbi_image_free(pixels);
    if (h != shape[1] || w != shape[2])
      img = torch::nn::functional::interpolate(img,
                                               torch::nn::functional::InterpolateFuncOptions()
                                                   .size(std::vector<int64_t>{shape[1], shape[2]})
                                                   .mode(torch::kBilinear)
                                                   .align_corners(false)
                                                   .antialias(true));
    images.push_back(img);
  }
  return (torch::cat(images) / 127.5 - 1.0).contiguous();
}

} // namespace

Expected<Dataset> loadDataset(const std::string &path, const std::vector<int64_t> &sampleShape) {
  if (fs::is_directory(path)) {
    auto images = loadImageFolder(path, sampleShape);
    if (!images)
      return images.status();
    return Dataset{images.take(), at::Tensor()};
  }
  auto bytes = readFile(path);
  if (!bytes)
    return bytes.status().withContext("--data");
  GANC_TRY(checkZipArchive(*bytes).withContext("--data " + path));
  c10::IValue value;
  try {
    value = torch::pickle_load(*bytes);
  } catch (const std::exception &e) {
    std::string what = e.what();
    return Status::error("--data " + path + ": not a torch.save file or image folder (" +
                         what.substr(0, what.find('\n')) + ")");
  }
  at::Tensor labels;
  if (value.isGenericDict() && value.toGenericDict().contains("images")) {
    auto dict = value.toGenericDict();
    if (dict.contains("labels") && dict.at("labels").isTensor())
      labels = dict.at("labels").toTensor().to(torch::kLong).flatten();
    value = dict.at("images");
  }
  if (!value.isTensor())
    return Status::error("--data " + path +
                         ": holds no tensor (expected a tensor or {'images': tensor})");
  at::Tensor data = value.toTensor().to(torch::kFloat32).contiguous();
  std::vector<int64_t> expected = {data.size(0)};
  expected.insert(expected.end(), sampleShape.begin(), sampleShape.end());
  if (data.dim() == 0 || data.sizes().vec() != expected)
    return Status::error("--data " + path + ": samples have shape " + c10::str(data.sizes()) +
                         ", the spec's data shape needs [N, " +
                         c10::str(c10::IntArrayRef(sampleShape)).substr(1));
  if (data.size(0) == 0)
    return Status::error("--data " + path + ": the dataset is empty");
  if (labels.defined() && labels.size(0) != data.size(0))
    return Status::error("--data " + path + ": " + std::to_string(labels.size(0)) + " labels for " +
                         std::to_string(data.size(0)) + " samples");
  return Dataset{data, labels};
}

ShardedBatches::ShardedBatches(int64_t datasetSize, int rank, int worldSize, int64_t batchSize,
                               uint64_t seed)
    : size_(datasetSize), numSamples_((datasetSize + worldSize - 1) / worldSize),
      batchSize_(batchSize), rank_(rank), world_(worldSize), seed_(seed) {
  startEpoch();
}

void ShardedBatches::startEpoch() {
  auto gen = at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(epoch_));
  at::Tensor perm = torch::randperm(size_, gen, torch::kLong);
  int64_t total = numSamples_ * world_;
  if (total > size_) {
    // Pad by repeating the permutation, as DistributedSampler does.
    std::vector<at::Tensor> parts = {perm};
    int64_t have = size_;
    while (have < total) {
      int64_t take = std::min(size_, total - have);
      parts.push_back(perm.narrow(0, 0, take));
      have += take;
    }
    perm = torch::cat(parts);
  }
  indices_ = perm.slice(0, rank_, total, world_);
  cursor_ = 0;
}

at::Tensor ShardedBatches::next() {
  if (cursor_ >= batchesPerEpoch()) {
    ++epoch_;
    startEpoch();
  }
  at::Tensor batch = indices_.narrow(0, cursor_ * batchSize_, batchSize_);
  ++cursor_;
  return batch;
}

void ShardedBatches::seek(int64_t epoch, int64_t cursor) {
  epoch_ = epoch;
  startEpoch();
  cursor_ = cursor;
}

} // namespace ganc::runtime
