// Dataset loading (torch.save files, image folders through stb_image) and rank sharding.
#include "runtime/data/Data.h"

#include "support/Files.h"
#include "support/Json.h"

#include <torch/serialize.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <sys/stat.h>

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

bool isImage(const std::string &name) {
  const std::string ext = lower(fs::path(name).extension().string());
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

/// One image of a folder or zip set: its path inside the set, and its bytes (zip) or file.
struct ImageSource {
  std::string name;
  fs::path file;
  std::vector<char> bytes;
};

/// Labels from StyleGAN's dataset.json (`"labels": [[path, class], ...]`, or null: unlabelled);
/// where there is none, from first-level folder names. Undefined if the set is unlabelled.
Expected<at::Tensor> datasetJsonLabels(const std::string &where,
                                       const std::vector<ImageSource> &images,
                                       const std::string &datasetJson, std::string &note) {
  auto parsed = parseJson(datasetJson, where + ": dataset.json");
  if (!parsed)
    return parsed.status();
  const nlohmann::json &j = *parsed;
  if (!j.is_object())
    return Status::error(where + ": dataset.json is not a JSON object");
  if (!j.contains("labels") || j["labels"].is_null()) {
    note = std::to_string(images.size()) + " images, unlabelled (dataset.json's labels: null)";
    return at::Tensor();
  }
  if (!j["labels"].is_array())
    return Status::error(where + ": dataset.json's labels must be a list of [path, class]");
  std::map<std::string, int64_t> byName;
  for (const nlohmann::json &pair : j["labels"]) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() ||
        !pair[1].is_number_integer())
      return Status::error(where + ": dataset.json's labels must be [path, class] pairs, not " +
                           pair.dump());
    if (!byName.emplace(pair[0].get<std::string>(), pair[1].get<int64_t>()).second)
      return Status::error(where + ": dataset.json labels " + pair[0].get<std::string>() +
                           " twice");
  }
  std::vector<int64_t> labels;
  for (const ImageSource &image : images) {
    auto found = byName.find(image.name);
    if (found == byName.end())
      return Status::error(where + ": " + image.name + " has no label in dataset.json");
    labels.push_back(found->second);
  }
  note = std::to_string(images.size()) + " images labelled by dataset.json";
  return torch::tensor(labels, torch::kLong);
}

/// Labels from StyleGAN's dataset.json where the set has one (it decides, as in StyleGAN's
/// loader), or from first-level folder names; undefined if the set is unlabelled.
Expected<at::Tensor> imageLabels(const std::string &where, const std::vector<ImageSource> &images,
                                 const std::optional<std::string> &datasetJson, std::string &note) {
  if (datasetJson)
    return datasetJsonLabels(where, images, *datasetJson, note);
  std::vector<int64_t> labels;
  std::vector<std::string> classes;
  for (const ImageSource &image : images) {
    const size_t slash = image.name.find('/');
    if (slash == std::string::npos)
      return at::Tensor(); // an image at the top: the set is unlabelled
    classes.push_back(image.name.substr(0, slash));
  }
  std::vector<std::string> sorted = classes;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  for (const std::string &c : classes)
    labels.push_back(std::lower_bound(sorted.begin(), sorted.end(), c) - sorted.begin());
  note = std::to_string(images.size()) + " images, " + std::to_string(sorted.size()) +
         " classes from folder names (0: " + sorted.front() +
         (sorted.size() > 1 ? (sorted.size() > 2 ? ", ..., " : ", ") +
                                  std::to_string(sorted.size() - 1) + ": " + sorted.back()
                            : std::string()) +
         ")";
  return torch::tensor(labels, torch::kLong);
}

Expected<Dataset> loadImages(const std::string &where, std::vector<ImageSource> images,
                             const std::optional<std::string> &datasetJson,
                             const std::vector<int64_t> &shape) {
  if (shape.size() != 3 || (shape[0] != 1 && shape[0] != 3))
    return Status::error("--data " + where +
                         ": images need a [C, H, W] data shape with C = 1 or 3 in the spec");
  if (images.empty())
    return Status::error("--data " + where + ": no PNG or JPEG images in it");
  std::sort(images.begin(), images.end(),
            [](const ImageSource &a, const ImageSource &b) { return a.name < b.name; });
  Dataset dataset;
  dataset.decoded = true;
  auto labels = imageLabels("--data " + where, images, datasetJson, dataset.note);
  if (!labels)
    return labels.status();
  dataset.labels = labels.take();
  const int channels = static_cast<int>(shape[0]);
  std::vector<at::Tensor> decoded;
  // An image is decoded whole before it is resized: its size is read from its header first,
  // so that a few kilobytes declaring 12000 x 12000 pixels are refused, not decoded.
  const int64_t mostPixels = std::max<int64_t>(int64_t{4096} * 4096, 64 * shape[1] * shape[2]);
  for (const ImageSource &image : images) {
    int w = 0, h = 0, n = 0;
    const bool known =
        image.bytes.empty()
            ? stbi_info(image.file.c_str(), &w, &h, &n)
            : stbi_info_from_memory(reinterpret_cast<const stbi_uc *>(image.bytes.data()),
                                    static_cast<int>(image.bytes.size()), &w, &h, &n);
    if (known && static_cast<int64_t>(w) * h > mostPixels)
      return Status::error(where + ": " + image.name + " is " + std::to_string(w) + "x" +
                           std::to_string(h) + " pixels, more than ganc decodes for " +
                           std::to_string(shape[1]) + "x" + std::to_string(shape[2]) +
                           " samples (" + std::to_string(mostPixels) + " pixels at most)");
    unsigned char *pixels =
        image.bytes.empty()
            ? stbi_load(image.file.c_str(), &w, &h, &n, channels)
            : stbi_load_from_memory(reinterpret_cast<const stbi_uc *>(image.bytes.data()),
                                    static_cast<int>(image.bytes.size()), &w, &h, &n, channels);
    if (!pixels)
      return Status::error(where + ": " + image.name + ": cannot decode image (" +
                           stbi_failure_reason() + ")");
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
    decoded.push_back(img);
  }
  dataset.samples = (torch::cat(decoded) / 127.5 - 1.0).contiguous();
  return dataset;
}

/// The image files under `root` (names relative to it, with '/'), each file once (by device
/// and inode). Symlinked folders are followed, but one that leads outside the root, or back
/// to a folder it lies in (a loop), is refused in one line naming the link.
class ImageWalk {
public:
  explicit ImageWalk(const std::string &root) : root_(root) {}

  Status run(std::vector<ImageSource> &images) {
    std::error_code ec;
    top_ = fs::canonical(root_, ec);
    if (ec)
      return Status::error("--data " + root_ + ": " + ec.message());
    return walk(top_, "", images);
  }

private:
  using Id = std::pair<dev_t, ino_t>;
  static std::optional<Id> idOf(const fs::path &path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      return std::nullopt;
    return Id{st.st_dev, st.st_ino};
  }

  Status walk(const fs::path &dir, const std::string &prefix, std::vector<ImageSource> &images) {
    const auto self = idOf(dir);
    if (!self || !walked_.insert(*self).second)
      return Status::ok(); // reached before through another link: its files are in already
    path_.push_back(*self);
    std::error_code listed, ec;
    fs::directory_iterator entries(dir, listed);
    if (listed)
      return Status::error("--data " + root_ + ": " + prefix + ": " + listed.message());
    for (const fs::directory_entry &e : entries) {
      const std::string name = prefix + e.path().filename().string();
      if (e.is_symlink(ec)) {
        const fs::path target = fs::canonical(e.path(), ec);
        if (ec)
          continue; // a dangling link: nothing to read
        const auto [end, rest] =
            std::mismatch(top_.begin(), top_.end(), target.begin(), target.end());
        if (end != top_.end())
          return Status::error("--data " + root_ + ": " + name + " is a symlink to " +
                               target.string() + ", outside the data folder");
      }
      if (e.is_directory(ec)) {
        const auto id = idOf(e.path());
        if (id && std::find(path_.begin(), path_.end(), *id) != path_.end())
          return Status::error("--data " + root_ + ": " + name +
                               " leads back to a folder it lies in (a symlink loop)");
        GANC_TRY(walk(e.path(), name + "/", images));
      } else if (e.is_regular_file(ec) && isImage(name)) {
        if (const auto id = idOf(e.path()); id && files_.insert(*id).second)
          images.push_back({name, e.path(), {}});
      }
    }
    path_.pop_back();
    return Status::ok();
  }

  std::string root_;
  fs::path top_;
  std::set<Id> walked_, files_;
  std::vector<Id> path_; // the folders from the root down to the one being read
};

/// A folder of images, searched recursively (names relative to it, with '/').
Expected<Dataset> loadImageFolder(const std::string &dir, const std::vector<int64_t> &shape) {
  std::vector<ImageSource> images;
  GANC_TRY(ImageWalk(dir).run(images));
  std::optional<std::string> datasetJson;
  if (fs::exists(fs::path(dir) / "dataset.json")) {
    auto text = readFile((fs::path(dir) / "dataset.json").string());
    if (!text)
      return text.status();
    datasetJson = std::string(text->begin(), text->end());
  }
  return loadImages(dir, std::move(images), datasetJson, shape);
}

/// A zip archive of images (StyleGAN's dataset format), with its dataset.json if any.
Expected<Dataset> loadImageZip(const std::string &path, const std::vector<char> &bytes,
                               const std::vector<int64_t> &shape) {
  // Image files are compressed already (PNG, JPEG): a set inflates to little more than its
  // archive. 16 times it, and 64 MiB of room, refuse a bomb before anything is inflated.
  const uint64_t budget = 16 * static_cast<uint64_t>(bytes.size()) + (uint64_t{64} << 20);
  auto files = readZipEntries(
      bytes, [](const std::string &name) { return isImage(name) || name == "dataset.json"; },
      budget);
  if (!files)
    return files.status().withContext("--data " + path);
  std::vector<ImageSource> images;
  std::optional<std::string> datasetJson;
  for (auto &[name, content] : *files) {
    if (name == "dataset.json")
      datasetJson = std::string(content.begin(), content.end());
    else
      images.push_back({name, fs::path(), std::move(content)});
  }
  return loadImages(path, std::move(images), datasetJson, shape);
}

/// Tensors outside [-1, 1] the way images in [0, 1] or [0, 255] are: a hint, not an error.
std::string rangeWarning(const std::string &path, const at::Tensor &data) {
  const double low = data.min().item<double>(), high = data.max().item<double>();
  char range[96];
  std::snprintf(range, sizeof(range), "[%.3g, %.3g]", low, high);
  if (low >= 0 && high > 1.5 && high <= 255)
    return "--data " + path + ": values span " + range +
           ", like 8-bit pixels; ganc trains on [-1, 1] (x / 127.5 - 1)";
  if (low < -255 || high > 255) // past any pixel range
    return "--data " + path + ": values span " + range +
           ", far outside [-1, 1], where ganc's generators and data are; rescale them";
  if (low >= 0 && high <= 1 && high > 0)
    return "--data " + path + ": values span " + range +
           ", like images in [0, 1]; ganc's generators and data are in [-1, 1] (x * 2 - 1)";
  return "";
}

/// torch.save's zip holds a pickle (NAME/data.pkl); any other zip is a set of images.
bool holdsPickle(const std::vector<std::string> &names) {
  return std::any_of(names.begin(), names.end(), [](const std::string &name) {
    return name.size() >= 9 && name.compare(name.size() - 9, 9, "/data.pkl") == 0;
  });
}

/// The object a torch.save file holds.
Expected<c10::IValue> unpickle(const std::string &path, const std::vector<char> &bytes) {
  try {
    return torch::pickle_load(bytes);
  } catch (const std::exception &e) {
    std::string what = e.what();
    return Status::error("--data " + path + ": not a torch.save file or image folder (" +
                         what.substr(0, what.find('\n')) + ")");
  }
}

/// A tensor file's "labels": a tensor or a list of integer class ids, one per sample. Float
/// labels (a class id is an integer: 1.5 or NaN would be truncated to another class) and other
/// values are refused, as dataset.json's are; absent: unlabelled.
Expected<at::Tensor> labelsOf(const c10::impl::GenericDict &dict, const std::string &path) {
  if (!dict.contains("labels"))
    return at::Tensor();
  const c10::IValue value = dict.at("labels");
  const std::string where = "--data " + path + ": 'labels' ";
  at::Tensor labels;
  if (value.isTensor()) {
    labels = value.toTensor();
  } else if (value.isList()) {
    std::vector<int64_t> ids;
    for (const c10::IValue &v : value.toListRef()) {
      if (!v.isInt())
        return Status::error(where + "is a list holding " + v.tagKind() +
                             " values: class labels are integers (a list of ints, or an int64 "
                             "tensor)");
      ids.push_back(v.toInt());
    }
    labels = torch::tensor(ids, torch::kLong);
  } else {
    return Status::error(where + "is a " + value.tagKind() +
                         ": class labels are a tensor or list of integers, one per sample");
  }
  if (labels.is_floating_point() || labels.is_complex()) {
    const at::Tensor whole = labels.flatten().to(torch::kDouble);
    const at::Tensor bad = (whole != whole.round()).logical_or(whole.isfinite().logical_not());
    if (bad.any().item<bool>()) {
      const int64_t i = bad.nonzero()[0][0].item<int64_t>();
      return Status::error(where + "are " + std::string(labels.dtype().name()) + ", and sample " +
                           std::to_string(i) + "'s is " + std::to_string(whole[i].item<double>()) +
                           ": class labels are integers (save them as int64)");
    }
  } else if (labels.scalar_type() == torch::kBool) {
    return Status::error(where + "are bool: class labels are integers (save them as int64)");
  }
  return labels.to(torch::kLong).flatten();
}

/// Samples are real numbers: a complex tensor's conversion to float32 drops its imaginary part
/// with only a warning, and a sparse or quantized one is no image either.
Status checkRealSamples(const at::Tensor &t, const std::string &what) {
  if (t.is_complex() || t.is_sparse() || t.is_quantized())
    return Status::error(what + " are " + std::string(c10::toString(t.scalar_type())) +
                         (t.is_sparse() ? " (sparse)" : "") +
                         ": ganc trains on real-valued samples (floating point or 8-bit pixels)");
  return Status::ok();
}

} // namespace

Expected<Dataset> loadDataset(const std::string &path, const std::vector<int64_t> &sampleShape) {
  if (fs::is_directory(path))
    return loadImageFolder(path, sampleShape);
  auto bytes = readFile(path);
  if (!bytes)
    return bytes.status().withContext("--data");
  std::vector<std::string> names;
  GANC_TRY(checkZipArchive(*bytes, &names).withContext("--data " + path));
  if (!holdsPickle(names))
    return loadImageZip(path, *bytes, sampleShape);
  auto unpickled = unpickle(path, *bytes);
  if (!unpickled)
    return unpickled.status();
  c10::IValue value = unpickled.take();
  at::Tensor labels;
  if (value.isGenericDict() && value.toGenericDict().contains("images")) {
    auto dict = value.toGenericDict();
    auto found = labelsOf(dict, path);
    if (!found)
      return found.status();
    labels = found.take();
    value = dict.at("images");
  }
  if (!value.isTensor())
    return Status::error("--data " + path +
                         ": holds no tensor (expected a tensor or {'images': tensor})");
  // float64 samples stay float64 (a float64 model trains on them exactly); anything else is
  // read as float32, the inputs' type of every other model.
  at::Tensor data = value.toTensor();
  if (data.dim() == 0)
    return Status::error("--data " + path +
                         ": holds a single number (a 0-d tensor), not "
                         "samples [N, " +
                         c10::str(c10::IntArrayRef(sampleShape)).substr(1));
  GANC_TRY(checkRealSamples(data, "--data " + path + ": samples"));
  data = data.to(data.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32)
             .contiguous();
  std::vector<int64_t> expected = {data.size(0)};
  expected.insert(expected.end(), sampleShape.begin(), sampleShape.end());
  if (data.sizes().vec() != expected)
    return Status::error("--data " + path + ": samples have shape " + c10::str(data.sizes()) +
                         ", the spec's data shape needs [N, " +
                         c10::str(c10::IntArrayRef(sampleShape)).substr(1));
  if (data.size(0) == 0)
    return Status::error("--data " + path + ": the dataset is empty");
  if (labels.defined() && labels.size(0) != data.size(0))
    return Status::error("--data " + path + ": " + std::to_string(labels.size(0)) + " labels for " +
                         std::to_string(data.size(0)) + " samples");
  return Dataset{data, labels, "", rangeWarning(path, data)};
}

DataLayout dataLayout(const frontend::Spec &spec) {
  return {spec.dataFields, spec.dataLayout == "side_by_side"};
}

namespace {

/// A torch.save dict of the fields' tensors, packed along dimension 1.
Expected<Dataset> loadFieldTensors(const std::string &path, const c10::IValue &value,
                                   const DataLayout &layout) {
  if (!value.isGenericDict())
    return Status::error("--data " + path + ": the spec's data has fields (" +
                         frontend::fieldNames(layout.fields) +
                         "): save a dict with a tensor per field");
  const auto dict = value.toGenericDict();
  std::vector<at::Tensor> parts;
  for (const frontend::DataField &f : layout.fields) {
    const std::string at = "--data " + path + ": field '" + f.name + "'";
    if (!dict.contains(f.name) || !dict.at(f.name).isTensor())
      return Status::error(at + " is missing (the dict holds no tensor of that name)");
    at::Tensor t = dict.at(f.name).toTensor();
    GANC_TRY(checkRealSamples(t, at + ": its samples"));
    t = t.to(t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32).contiguous();
    std::vector<int64_t> expected = {t.dim() ? t.size(0) : 0};
    expected.insert(expected.end(), f.shape.begin(), f.shape.end());
    if (t.dim() == 0 || t.sizes().vec() != expected)
      return Status::error(at + " has shape " + c10::str(t.sizes()) +
                           ", the spec's field needs [N, " +
                           c10::str(c10::IntArrayRef(f.shape)).substr(1));
    if (!parts.empty() && (t.size(0) != parts[0].size(0) || t.dtype() != parts[0].dtype()))
      return Status::error(at + " has " + std::to_string(t.size(0)) + " " +
                           std::string(t.dtype().name()) + " samples, field '" +
                           layout.fields[0].name + "' " + std::to_string(parts[0].size(0)) + " " +
                           std::string(parts[0].dtype().name()));
    parts.push_back(t);
  }
  auto labels = labelsOf(dict, path);
  if (!labels)
    return labels.status();
  at::Tensor data = torch::cat(parts, 1);
  if (data.size(0) == 0)
    return Status::error("--data " + path + ": the dataset is empty");
  if (labels->defined() && labels->size(0) != data.size(0))
    return Status::error("--data " + path + ": " + std::to_string(labels->size(0)) +
                         " labels for " + std::to_string(data.size(0)) + " samples");
  return Dataset{data, *labels, "fields " + frontend::fieldNames(layout.fields),
                 rangeWarning(path, data)};
}

} // namespace

Expected<Dataset> loadDataset(const std::string &path, const std::vector<int64_t> &sampleShape,
                              const DataLayout &layout) {
  if (layout.fields.empty())
    return loadDataset(path, sampleShape);
  std::vector<char> bytes;
  std::vector<std::string> names;
  if (!fs::is_directory(path)) {
    auto read = readFile(path);
    if (!read)
      return read.status().withContext("--data");
    bytes = read.take();
    GANC_TRY(checkZipArchive(bytes, &names).withContext("--data " + path));
  }
  if (holdsPickle(names)) {
    auto value = unpickle(path, bytes);
    if (!value)
      return value.status();
    return loadFieldTensors(path, *value, layout);
  }
  if (!layout.sideBySide)
    return Status::error("--data " + path +
                         ": an image holds one sample, and the spec's data has "
                         "fields (" +
                         frontend::fieldNames(layout.fields) +
                         "): set 'data.layout' to "
                         "\"side_by_side\" for images holding them left to right, or save a dict "
                         "with a tensor per field");
  // Each image is the fields left to right: decoded at k times a field's width, then split.
  const std::vector<int64_t> &field = layout.fields[0].shape;
  const auto k = static_cast<int64_t>(layout.fields.size());
  const std::vector<int64_t> wide = {field[0], field[1], field[2] * k};
  auto data = bytes.empty() ? loadImageFolder(path, wide) : loadImageZip(path, bytes, wide);
  if (!data)
    return data.status();
  at::Tensor &x = data->samples;
  x = x.view({x.size(0), field[0], field[1], k, field[2]})
          .permute({0, 3, 1, 2, 4})
          .reshape({x.size(0), k * field[0], field[1], field[2]})
          .contiguous();
  data->note += (data->note.empty() ? "" : "; ") +
                std::string("each image split side by side into ") +
                frontend::fieldNames(layout.fields);
  return data;
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
