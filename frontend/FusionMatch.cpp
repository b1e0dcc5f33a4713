// The graph predicates fusion matches with (see FusionMatch.h).
#include "frontend/FusionMatch.h"

#include <torch/csrc/jit/ir/constants.h>

#include <deque>
#include <set>

namespace ganc::frontend::match {

namespace jit = torch::jit;

std::optional<int64_t> constInt(Value *v) {
  auto iv = jit::toIValue(v);
  if (iv && iv->isInt())
    return iv->toInt();
  return std::nullopt;
}

// A constant number: an int, a float, or a one-element constant tensor (a traced `x * gain`).
std::optional<double> constNumber(Value *v) {
  auto iv = jit::toIValue(v);
  if (!iv)
    return std::nullopt;
  if (iv->isInt())
    return static_cast<double>(iv->toInt());
  if (iv->isDouble())
    return iv->toDouble();
  if (iv->isTensor() && iv->toTensor().numel() == 1 && iv->toTensor().dim() == 0)
    return iv->toTensor().item<double>();
  return std::nullopt;
}

bool isNone(Value *v) { return v->type()->kind() == c10::TypeKind::NoneType; }

bool usedOnce(Value *v) { return v->uses().size() == 1; }

namespace {

// The items of an int list: its elements' values (a ListConstruct), or constants.
std::optional<std::vector<Value *>> listItems(Value *list) {
  if (list->node()->kind() == c10::prim::ListConstruct)
    return list->node()->inputs().vec();
  return std::nullopt;
}

} // namespace

// An int list's values where all of them are constants (a constant list, or a ListConstruct
// of constants).
std::optional<std::vector<int64_t>> constInts(Value *list) {
  auto iv = jit::toIValue(list);
  if (iv && iv->isIntList())
    return iv->toIntVector();
  auto items = listItems(list);
  if (!items)
    return std::nullopt;
  std::vector<int64_t> out;
  for (Value *item : *items) {
    auto n = constInt(item);
    if (!n)
      return std::nullopt;
    out.push_back(*n);
  }
  return out;
}

// The list's length, whether its items are constants or not.
std::optional<size_t> listLength(Value *list) {
  if (auto ints = constInts(list))
    return ints->size();
  if (auto items = listItems(list))
    return items->size();
  return std::nullopt;
}

// Item `i` of an int list: a value of the graph, or nullptr where the list is constant
// (`constant` then holds it).
bool listItem(Value *list, size_t i, Value *&item, std::optional<int64_t> &constant) {
  item = nullptr;
  constant.reset();
  if (auto ints = constInts(list)) {
    if (i >= ints->size())
      return false;
    constant = (*ints)[i];
    return true;
  }
  auto items = listItems(list);
  if (!items || i >= items->size())
    return false;
  item = (*items)[i];
  constant = constInt(item);
  return true;
}

// v without the int <-> tensor conversions a trace puts around sizes.
Value *stripConversions(Value *v) {
  while (v->node()->kind() == c10::aten::Int || v->node()->kind() == c10::prim::NumToTensor ||
         v->node()->kind() == c10::aten::ScalarImplicit)
    v = v->node()->input(0);
  return v;
}

// Whether `v` is x.size(dim) of the 4-D x (read as aten::size(x, dim), aten::size(x)[dim] or
// unpacked from aten::size(x)).
bool isSizeOf(Value *v, Value *x, int64_t dim) {
  v = stripConversions(v);
  Node *n = v->node();
  const auto sameDim = [&](std::optional<int64_t> d) { return d && (*d == dim || *d == dim - 4); };
  if (n->kind() == c10::aten::size && n->inputs().size() == 2)
    return n->input(0) == x && sameDim(constInt(n->input(1)));
  const auto sizesOfX = [&](Value *list) {
    return list->node()->kind() == c10::aten::size && list->node()->inputs().size() == 1 &&
           list->node()->input(0) == x;
  };
  if (n->kind() == c10::prim::ListUnpack)
    return sizesOfX(n->input(0)) && static_cast<int64_t>(v->offset()) == dim;
  if (n->kind() == c10::aten::__getitem__)
    return sizesOfX(n->input(0)) && sameDim(constInt(n->input(1)));
  return false;
}

// Whether `v` is x.size(dim) * factor (as a trace or a script writes it).
bool isScaledSizeOf(Value *v, Value *x, int64_t dim, int64_t factor) {
  if (isSizeOf(v, x, dim))
    return factor == 1;
  v = stripConversions(v);
  Node *n = v->node();
  if (n->kind() != c10::aten::mul || n->inputs().size() != 2)
    return false;
  for (size_t i = 0; i < 2; ++i) {
    auto scale = constNumber(n->input(1 - i));
    if (scale && *scale == static_cast<double>(factor) && isSizeOf(n->input(i), x, dim))
      return true;
  }
  return false;
}

std::optional<int64_t> sizeMinus(Value *v, Value *x, int64_t dim) {
  if (isSizeOf(v, x, dim))
    return 0;
  v = stripConversions(v);
  Node *n = v->node();
  if (n->kind() != c10::aten::sub || n->inputs().size() != 3 || constNumber(n->input(2)) != 1.0)
    return std::nullopt;
  auto k = constNumber(n->input(1));
  if (!k || *k < 0 || *k != static_cast<double>(static_cast<int64_t>(*k)) ||
      !isSizeOf(n->input(0), x, dim))
    return std::nullopt;
  return static_cast<int64_t>(*k);
}

// Why `f` is not a constant filter ("" where it is: computed from constants and buffers only).
std::string notConstant(Value *f, const std::function<bool(const Value *)> &isParameter) {
  std::deque<Value *> todo{f};
  std::set<Value *> seen;
  while (!todo.empty()) {
    Value *v = todo.front();
    todo.pop_front();
    if (!seen.insert(v).second)
      continue;
    if (isParameter(v))
      return "a learned filter (computed from a parameter)";
    Node *n = v->node();
    if (n->kind() == c10::prim::GetAttr)
      continue; // a buffer or a constant attribute of the model
    if (n->kind() == c10::prim::device || n->kind() == c10::prim::dtype ||
        n->kind() == c10::aten::size || n->kind() == c10::aten::dim)
      continue; // where or how a tensor is, not its values (torch.ones([1, 1], device=x.device))
    if (n->kind() == c10::prim::Param)
      return "a filter computed from the phase's inputs";
    if (!n->blocks().empty())
      return "a filter computed under control flow";
    for (Value *in : n->inputs())
      todo.push_back(in);
  }
  return "";
}

std::string where(const Node *n) {
  auto place = n->sourceRange().file_line_col();
  if (!place)
    return "";
  std::string file = std::get<0>(*place);
  const size_t slash = file.rfind('/');
  return " (" + (slash == std::string::npos ? file : file.substr(slash + 1)) + ":" +
         std::to_string(std::get<1>(*place)) + ")";
}

std::optional<Convolution> convolutionOf(Node *n) {
  Convolution c;
  if (n->kind() == c10::aten::conv2d && n->inputs().size() == 7) {
    if (n->input(4)->type()->kind() == c10::TypeKind::StringType)
      return std::nullopt; // padding="same"
    c = {n->input(0), n->input(1), n->input(2), n->input(3), n->input(4), n->input(5), n->input(6)};
    return c;
  }
  if ((n->kind() == c10::aten::_convolution && n->inputs().size() >= 12) ||
      (n->kind() == c10::aten::convolution && n->inputs().size() == 9)) {
    auto transposed = jit::toIValue(n->input(6));
    if (!transposed || !transposed->isBool())
      return std::nullopt;
    c = {n->input(0), n->input(1), n->input(2), n->input(3),
         n->input(4), n->input(5), n->input(8), transposed->toBool()};
    return c;
  }
  return std::nullopt;
}

bool allEqual(const std::optional<std::vector<int64_t>> &values, int64_t to) {
  return values && !values->empty() &&
         std::all_of(values->begin(), values->end(), [&](int64_t v) { return v == to; });
}

bool isPad(Node *n) {
  if (n->kind() == c10::aten::constant_pad_nd)
    return n->inputs().size() == 3 && constNumber(n->input(2)) == 0.0;
  if (n->kind() != c10::aten::pad || n->inputs().size() != 4)
    return false;
  auto mode = jit::toIValue(n->input(2));
  return mode && mode->isString() && mode->toStringRef() == "constant" &&
         (isNone(n->input(3)) || constNumber(n->input(3)) == 0.0);
}

bool isReshape(Node *n) {
  return (n->kind() == c10::aten::reshape || n->kind() == c10::aten::view) &&
         n->inputs().size() == 2;
}

} // namespace ganc::frontend::match
