// Types, values and the module's lookup helpers.
#include "ir/Module.h"

#include "support/TextFormat.h"

#include <algorithm>
#include <cctype>
#include <set>

namespace ganc::ir {

namespace {
const std::set<std::string> &tensorDtypes() {
  static const std::set<std::string> dtypes = {"f16", "bf16", "f32",    "f64",   "i8",
                                               "i16", "i32",  "i64",    "u8",    "b8",
                                               "c64", "c128", "f8e4m3", "f8e5m2"};
  return dtypes;
}
const std::set<std::string> &floatDtypes() {
  static const std::set<std::string> dtypes = {"f16", "bf16", "f32",    "f64",
                                               "c64", "c128", "f8e4m3", "f8e5m2"};
  return dtypes;
}
} // namespace

Type Type::tensor(std::string dtype, std::vector<int64_t> shape) {
  Type t;
  t.kind = Kind::Tensor;
  t.dtype = std::move(dtype);
  t.shape = std::move(shape);
  t.hasShape = true;
  return t;
}

Type Type::unknownTensor(std::string dtype) {
  Type t;
  t.kind = Kind::Tensor;
  t.dtype = std::move(dtype);
  return t;
}

Type Type::other(std::string name, std::vector<Type> elements) {
  Type t;
  t.name = std::move(name);
  t.elements = std::move(elements);
  return t;
}

bool Type::mayCarryGradient() const {
  if (isTensor())
    return dtype.empty() || floatDtypes().count(dtype) > 0;
  if (name == "list" || name == "tuple" || name == "optional" || name == "any")
    for (const Type &element : elements)
      if (element.mayCarryGradient())
        return true;
  return name == "any";
}

int64_t Type::elementSize(const std::string &dtype) {
  static const std::map<std::string, int64_t> sizes = {
      {"f16", 2}, {"bf16", 2}, {"f32", 4}, {"f64", 8}, {"i8", 1},    {"i16", 2},    {"i32", 4},
      {"i64", 8}, {"u8", 1},   {"b8", 1},  {"c64", 8}, {"c128", 16}, {"f8e4m3", 1}, {"f8e5m2", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

int64_t Type::numel() const {
  if (!isTensor() || !hasShape)
    return -1;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      return -1; // unknown, or too large to count in int64
  }
  return n;
}

bool Type::operator==(const Type &o) const {
  return kind == o.kind && dtype == o.dtype && hasShape == o.hasShape &&
         (!hasShape || shape == o.shape) && name == o.name && elements == o.elements;
}

std::string Type::str() const {
  if (isTensor()) {
    std::string s = dtype.empty() ? "tensor" : dtype;
    if (hasShape) {
      s += "[";
      for (size_t i = 0; i < shape.size(); ++i) {
        if (i)
          s += ",";
        s += shape[i] < 0 ? "?" : std::to_string(shape[i]);
      }
      s += "]";
    } else if (!dtype.empty()) {
      s += "[*]";
    }
    return s;
  }
  std::string s = name;
  if (!elements.empty()) {
    s += "<";
    for (size_t i = 0; i < elements.size(); ++i) {
      if (i)
        s += ",";
      s += elements[i].str();
    }
    s += ">";
  }
  return s;
}

namespace {
/// Recursive-descent reader of the type grammar over one string.
class TypeReader {
public:
  explicit TypeReader(const std::string &text) : text_(text) {}

  Expected<Type> readAll() {
    auto type = read();
    if (!type)
      return type;
    if (pos_ != text_.size())
      return Status::error("unexpected '" + text_.substr(pos_) + "' in type '" + text_ + "'");
    return type;
  }

private:
  std::string identifier() {
    size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                   text_[pos_] == '_' || text_[pos_] == '.' || text_[pos_] == ':'))
      ++pos_;
    return text_.substr(start, pos_ - start);
  }

  Expected<Type> read() {
    std::string name = identifier();
    if (name.empty())
      return Status::error("expected a type in '" + text_ + "'");
    if (name == "tensor" || tensorDtypes().count(name)) {
      Type t = Type::unknownTensor(name == "tensor" ? "" : name);
      if (pos_ < text_.size() && text_[pos_] == '[') {
        ++pos_;
        if (pos_ < text_.size() && text_[pos_] == '*') {
          ++pos_;
        } else {
          t.hasShape = true;
          while (pos_ < text_.size() && text_[pos_] != ']') {
            if (text_[pos_] == '?') {
              t.shape.push_back(-1);
              ++pos_;
            } else {
              size_t start = pos_;
              while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])))
                ++pos_;
              if (start == pos_)
                return Status::error("bad dimension in type '" + text_ + "'");
              auto dim = parseInt64(text_.substr(start, pos_ - start));
              if (!dim)
                return Status::error("dimension out of range in type '" + text_ + "'");
              t.shape.push_back(*dim);
            }
            if (pos_ < text_.size() && text_[pos_] == ',')
              ++pos_;
          }
        }
        if (pos_ >= text_.size() || text_[pos_] != ']')
          return Status::error("unterminated shape in type '" + text_ + "'");
        ++pos_;
      }
      return t;
    }
    Type t = Type::other(name);
    if (pos_ < text_.size() && text_[pos_] == '<') {
      ++pos_;
      while (true) {
        auto element = read();
        if (!element)
          return element;
        t.elements.push_back(element.take());
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < text_.size() && text_[pos_] == '>') {
          ++pos_;
          break;
        }
        return Status::error("unterminated '<' in type '" + text_ + "'");
      }
    }
    return t;
  }

  const std::string &text_;
  size_t pos_ = 0;
};
} // namespace

Expected<Type> parseType(const std::string &text) { return TypeReader(text).readAll(); }

const Attribute *Op::attribute(const std::string &key) const {
  for (const auto &[name, value] : attributes)
    if (name == key)
      return &value;
  return nullptr;
}

int64_t Tensor::bytes() const {
  int64_t bytes = 0;
  if (type.numel() < 0 ||
      __builtin_mul_overflow(type.numel(), Type::elementSize(type.dtype), &bytes))
    return -1;
  return bytes;
}

Piece pieceOf(int64_t elements, int64_t ranks, int64_t rank) {
  const int64_t base = elements / ranks;
  const int64_t extra = elements % ranks;
  return Piece{rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

bool isWithin(const std::string &name, const std::string &path) {
  return name == path || (name.size() > path.size() && name.compare(0, path.size(), path) == 0 &&
                          name[path.size()] == '.');
}

bool Phase::trains(const std::string &parameter) const {
  return std::any_of(updates.begin(), updates.end(),
                     [&](const std::string &path) { return isWithin(parameter, path); });
}

std::string Phase::jointDeclined() const {
  if (joint.ops.empty() || onlyJoint())
    return "";
  if (fusedResamplings + fusedBiasActs > 0)
    return "the plan fuses " + std::to_string(fusedResamplings) + " resampling(s) and " +
           std::to_string(fusedBiasActs) + " bias + activation(s) in it, which its joint graph " +
           "does not fuse yet";
  if (doubleBackward == "grouped" && jointGroupedConvolutions != 0)
    return "--double-backward grouped: its joint graph takes ganc's double backward of the "
           "filters only (filters)";
  if (doubleBackward == "pytorch" && jointGroupedConvolutions > 0)
    return "--double-backward pytorch: its joint graph takes ganc's double backward of its " +
           std::to_string(jointGroupedConvolutions) + " grouped convolution(s) (filters)";
  if (doubleBackward == "filters" && jointGroupedConvolutions < 0)
    return "its joint graph was captured with PyTorch's double backward (export it again for "
           "ganc's)";
  return "";
}

Value *Phase::newValue(std::string name, Type type) {
  values_.push_back(std::make_unique<Value>());
  Value *v = values_.back().get();
  v->name = std::move(name);
  v->type = std::move(type);
  return v;
}

const Tensor *Module::findParameter(const std::string &name) const {
  for (const Tensor &p : parameters)
    if (p.name == name)
      return &p;
  return nullptr;
}

Phase *Module::findPhase(const std::string &key) const {
  for (const auto &phase : phases)
    if (phase->key() == key)
      return phase.get();
  return nullptr;
}

std::set<std::string> Module::usedInStage(const std::string &stage) const {
  std::set<std::string> used;
  for (const auto &phase : phases)
    if (phase->stage == stage)
      used.insert(phase->used.begin(), phase->used.end());
  return used;
}

} // namespace ganc::ir
