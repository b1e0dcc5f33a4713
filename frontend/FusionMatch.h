// The graph predicates fusion matches with (frontend/Fusion.cpp): constants, int lists, sizes
// read from a tensor, pads, reshapes and convolutions as TorchScript and traces write them.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ganc::frontend::match {

using torch::jit::Node;
using torch::jit::Value;

std::optional<int64_t> constInt(Value *v);
/// A constant number: an int, a float, or a one-element constant tensor (a traced `x * gain`).
std::optional<double> constNumber(Value *v);
bool isNone(Value *v);
bool usedOnce(Value *v);
/// An int list's values where all of them are constants (a constant list, or a ListConstruct
/// of constants).
std::optional<std::vector<int64_t>> constInts(Value *list);
/// The list's length, whether its items are constants or not.
std::optional<size_t> listLength(Value *list);
/// Item `i` of an int list: a value of the graph, or nullptr where the list is constant
/// (`constant` then holds it).
bool listItem(Value *list, size_t i, Value *&item, std::optional<int64_t> &constant);
/// v without the int <-> tensor conversions a trace puts around sizes.
Value *stripConversions(Value *v);
/// Whether `v` is x.size(dim) of the 4-D x (read as aten::size(x, dim), aten::size(x)[dim] or
/// unpacked from aten::size(x)).
bool isSizeOf(Value *v, Value *x, int64_t dim);
/// Whether `v` is x.size(dim) * factor (as a trace or a script writes it).
bool isScaledSizeOf(Value *v, Value *x, int64_t dim, int64_t factor);
/// Whether `v` is x.size(dim) - k for a constant k >= 0 (a trace's `x.shape[2] - k`): k, else
/// nothing.
std::optional<int64_t> sizeMinus(Value *v, Value *x, int64_t dim);
/// Why `f` is not a constant filter ("" where it is: computed from constants and buffers only).
std::string notConstant(Value *f, const std::function<bool(const Value *)> &isParameter);
/// " (file:line)" of a node, where the graph knows it.
std::string where(const Node *n);

/// A convolution's arguments, where the node is one.
struct Convolution {
  Value *input = nullptr, *weight = nullptr, *bias = nullptr, *stride = nullptr;
  Value *padding = nullptr, *dilation = nullptr, *groups = nullptr;
  bool transposed = false;
};

std::optional<Convolution> convolutionOf(Node *n);
bool allEqual(const std::optional<std::vector<int64_t>> &values, int64_t to);
/// F.pad / constant_pad_nd with zeros.
bool isPad(Node *n);
bool isReshape(Node *n);

} // namespace ganc::frontend::match
