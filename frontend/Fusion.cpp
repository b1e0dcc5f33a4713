// The fusion of a phase graph's resampling and bias + activation into ganc's ops (see
// Fusion.h). Each match is checked structurally, value by value: constants where the op needs
// a number, sizes read from the very tensor the pattern resamples, single uses of everything
// it consumes. What fails a check is left as it is (a near miss where it looked like one).
#include "frontend/Fusion.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <deque>
#include <limits>
#include <optional>
#include <set>

namespace ganc::frontend {
namespace {

namespace jit = torch::jit;
using jit::Node;
using jit::Value;

std::optional<int64_t> constInt(Value *v) {
  auto iv = jit::toIValue(v);
  if (iv && iv->isInt())
    return iv->toInt();
  return std::nullopt;
}

/// A constant number: an int, a float, or a one-element constant tensor (a traced `x * gain`).
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

/// The items of an int list: its elements' values (a ListConstruct), or constants.
std::optional<std::vector<Value *>> listItems(Value *list) {
  if (list->node()->kind() == c10::prim::ListConstruct)
    return list->node()->inputs().vec();
  return std::nullopt;
}

/// An int list's values where all of them are constants (a constant list, or a ListConstruct
/// of constants).
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

/// The list's length, whether its items are constants or not.
std::optional<size_t> listLength(Value *list) {
  if (auto ints = constInts(list))
    return ints->size();
  if (auto items = listItems(list))
    return items->size();
  return std::nullopt;
}

/// Item `i` of an int list: a value of the graph, or nullptr where the list is constant
/// (`constant` then holds it).
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

/// v without the int <-> tensor conversions a trace puts around sizes.
Value *stripConversions(Value *v) {
  while (v->node()->kind() == c10::aten::Int || v->node()->kind() == c10::prim::NumToTensor ||
         v->node()->kind() == c10::aten::ScalarImplicit)
    v = v->node()->input(0);
  return v;
}

/// Whether `v` is x.size(dim) of the 4-D x (read as aten::size(x, dim), aten::size(x)[dim] or
/// unpacked from aten::size(x)).
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

/// Whether `v` is x.size(dim) * factor (as a trace or a script writes it).
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

/// Why `f` is not a constant filter ("" where it is: computed from constants and buffers only).
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

/// A convolution's arguments, where the node is one.
struct Convolution {
  Value *input = nullptr, *weight = nullptr, *bias = nullptr, *stride = nullptr;
  Value *padding = nullptr, *dilation = nullptr, *groups = nullptr;
  bool transposed = false;
};

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

/// One resampling found at a convolution: what ganc::upfirdn2d takes, and the node whose
/// output it replaces.
struct Resampling {
  Value *input = nullptr, *filter = nullptr, *padding = nullptr;
  std::vector<int64_t> constPadding;
  std::array<int64_t, 2> up{1, 1}, down{1, 1};
  Node *last = nullptr;
  std::string origin;
};

class Fuser {
public:
  Fuser(jit::Graph &graph, const std::function<bool(const Value *)> &isParameter)
      : graph_(graph), isParameter_(isParameter) {}

  FusionReport run() {
    for (Node *n : allNodes(graph_.block()))
      if (auto found = matchResampling(n))
        replaceResampling(*found);
    for (Node *n : allNodes(graph_.block()))
      if (!consumed_.count(n))
        matchBiasAct(n);
    jit::EliminateDeadCode(graph_.block());
    return report_;
  }

  /// Every node of `block` and of the blocks nested in it (a per-call trace's dispatch puts
  /// the network in the branches of an if), in order.
  static std::vector<Node *> allNodes(jit::Block *block) {
    std::vector<Node *> nodes;
    for (Node *n : block->nodes()) {
      nodes.push_back(n);
      for (jit::Block *inner : n->blocks())
        for (Node *m : allNodes(inner))
          nodes.push_back(m);
    }
    return nodes;
  }

private:
  void nearMiss(const std::string &pattern, const std::string &why, const Node *n) {
    report_.nearMisses.push_back({pattern, why + where(n)});
  }

  /// The filter of a depthwise weight: f unsqueezed to [1, 1, kh, kw] (and repeated over
  /// `repeats`, nullptr where not repeated), through a dtype conversion or not.
  static Value *filterOf(Value *weight, Value *&repeats) {
    repeats = nullptr;
    if (weight->node()->kind() == c10::aten::to)
      weight = weight->node()->input(0);
    if (weight->node()->kind() == c10::aten::repeat) {
      Value *list = weight->node()->input(1);
      Value *item = nullptr;
      std::optional<int64_t> c;
      if (listLength(list) != 4u)
        return nullptr;
      for (size_t i = 1; i < 4; ++i)
        if (!listItem(list, i, item, c) || c != 1)
          return nullptr;
      listItem(list, 0, repeats, c);
      if (!repeats)
        repeats = list; // a constant count: checked against groups by the caller
      weight = weight->node()->input(0);
    }
    Node *n = weight->node();
    if (n->kind() == c10::aten::unsqueeze && constInt(n->input(1)) == 1 &&
        n->input(0)->node()->kind() == c10::aten::unsqueeze &&
        constInt(n->input(0)->node()->input(1)) == 0)
      return n->input(0)->node()->input(0);
    if (isReshape(n)) {
      auto ints = constInts(n->input(1));
      Value *item = nullptr;
      std::optional<int64_t> c0, c1;
      if (listLength(n->input(1)) == 4u && listItem(n->input(1), 0, item, c0) && c0 == 1 &&
          listItem(n->input(1), 1, item, c1) && c1 == 1)
        return n->input(0);
    }
    return nullptr;
  }

  std::optional<Resampling> matchResampling(Node *n) {
    auto conv = convolutionOf(n);
    if (!conv || conv->transposed || !isNone(conv->bias))
      return std::nullopt;
    Value *repeats = nullptr;
    Value *filter = filterOf(conv->weight, repeats);
    if (!filter)
      return std::nullopt;
    auto groups = constInt(conv->groups);
    const std::string why = notConstant(filter, isParameter_);
    if (!why.empty()) {
      nearMiss("upfirdn2d", why, n);
      return std::nullopt;
    }
    if (repeats == nullptr && groups != 1)
      return std::nullopt; // one [1, 1, kh, kw] filter for several groups: not a resampling
    auto stride = constInts(conv->stride);
    auto padding = constInts(conv->padding);
    if (!allEqual(constInts(conv->dilation), 1) || !stride || !padding || !groups) {
      nearMiss("upfirdn2d", "a stride, padding, dilation or group count that is not a constant", n);
      return std::nullopt;
    }
    Resampling r;
    r.origin = originOf(n);
    r.filter = filter;
    r.down = {stride->back(), stride->front()};
    r.last = n;
    if (allEqual(stride, 1))
      absorbSlices(r);
    const std::vector<int64_t> p =
        padding->size() == 1 ? std::vector<int64_t>(2, padding->front()) : *padding;
    r.constPadding = {p[1], p[1], p[0], p[0]};
    r.input = conv->input;
    if (allEqual(padding, 0))
      absorbPad(r);
    absorbZeroInsertion(r, n);
    if (repeats && !repeatsChannels(repeats, *groups, r.input, conv->input)) {
      nearMiss("upfirdn2d", "a filter repeated over a count that is not the input's channels", n);
      return std::nullopt;
    }
    return r;
  }

  static std::string originOf(const Node *n) {
    const c10::FunctionSchema *schema = n->maybeSchema();
    std::string name = n->kind().toQualString();
    if (schema && !schema->overload_name().empty())
      name += "." + schema->overload_name();
    return name;
  }

  /// x[:, :, ::dy, ::dx] after the convolution: into `down`.
  static void absorbSlices(Resampling &r) {
    Value *y = r.last->output();
    while (usedOnce(y) && y->uses()[0].user->kind() == c10::aten::slice) {
      Node *s = y->uses()[0].user;
      if (s->inputs().size() != 5 || s->input(0) != y)
        break;
      auto dim = constInt(s->input(1)), step = constInt(s->input(4));
      auto start = isNone(s->input(2)) ? std::optional<int64_t>(0) : constInt(s->input(2));
      auto end = isNone(s->input(3)) ? std::optional<int64_t>(std::numeric_limits<int64_t>::max())
                                     : constInt(s->input(3));
      if (!dim || !step || start != 0 || !end || *end < (int64_t{1} << 62) || *step < 1)
        break;
      const int64_t d = *dim < 0 ? *dim + 4 : *dim;
      if (d == 2)
        r.down[1] *= *step;
      else if (d == 3)
        r.down[0] *= *step;
      else if (*step != 1)
        break;
      r.last = s;
      y = s->output();
    }
  }

  /// F.pad(x, [x0, x1, y0, y1]) before a convolution without padding of its own.
  static void absorbPad(Resampling &r) {
    Node *pad = r.input->node();
    if (!usedOnce(r.input) || !isPad(pad) || listLength(pad->input(1)) != 4u)
      return;
    r.padding = pad->input(1);
    r.input = pad->input(0);
  }

  /// The zero insertion of StyleGAN's reference upfirdn2d before the padding: into `up`.
  void absorbZeroInsertion(Resampling &r, const Node *conv) {
    Node *wide = r.input->node();
    if (!usedOnce(r.input) || !isReshape(wide) || listLength(wide->input(1)) != 4u)
      return;
    Value *padded = wide->input(0);
    Node *pad = padded->node();
    if (!usedOnce(padded) || !isPad(pad))
      return;
    auto inserted = constInts(pad->input(1));
    Value *six = pad->input(0);
    Node *narrow = six->node();
    if (!inserted || inserted->size() != 6 || !usedOnce(six) || !isReshape(narrow) ||
        listLength(narrow->input(1)) != 6u)
      return;
    const std::vector<int64_t> &z = *inserted;
    Value *x = narrow->input(0);
    const int64_t ux = z[1] + 1, uy = z[5] + 1;
    bool sizes = z[0] == 0 && z[2] == 0 && z[3] == 0 && z[4] == 0 && ux >= 1 && uy >= 1;
    Value *item = nullptr;
    std::optional<int64_t> c;
    const int64_t fromSix[6] = {0, 1, 2, -1, 3, -1}; // x's dimension at each place, or a 1
    for (size_t i = 0; sizes && i < 6; ++i)
      sizes = listItem(narrow->input(1), i, item, c) &&
              (fromSix[i] < 0 ? c == 1 : item && isSizeOf(item, x, fromSix[i]));
    const int64_t scale[4] = {1, 1, uy, ux};
    for (size_t i = 0; sizes && i < 4; ++i)
      sizes = listItem(wide->input(1), i, item, c) && item &&
              isScaledSizeOf(item, x, static_cast<int64_t>(i), scale[i]);
    if (!sizes) {
      nearMiss("upfirdn2d", "a zero insertion whose sizes are not its input's (left unfused)",
               conv);
      return;
    }
    r.up = {ux, uy};
    r.input = x;
  }

  /// Whether the filter's repeat count is the channels of the tensor resampled (a depthwise
  /// filter, one copy per channel), so that groups = channels.
  static bool repeatsChannels(Value *repeats, int64_t groups, Value *input, Value *convInput) {
    if (repeats->type()->kind() == c10::TypeKind::ListType) {
      auto ints = constInts(repeats);
      return ints && ints->front() == groups;
    }
    if (auto c = constInt(repeats))
      return *c == groups;
    return isSizeOf(repeats, input, 1) || isSizeOf(repeats, convInput, 1);
  }

  void replaceResampling(const Resampling &r) {
    jit::WithInsertPoint point(r.last);
    Value *padding = r.padding ? r.padding : graph_.insertConstant(r.constPadding);
    std::vector<Value *> inputs = {
        r.input,
        r.filter,
        graph_.insertConstant(std::vector<int64_t>(r.up.begin(), r.up.end())),
        graph_.insertConstant(std::vector<int64_t>(r.down.begin(), r.down.end())),
        padding,
        graph_.insertConstant(true),
        graph_.insertConstant(1.0),
        graph_.insertConstant(r.origin)};
    Node *op = graph_.create(c10::Symbol::fromQualString("ganc::upfirdn2d"), inputs, 1);
    op->insertBefore(r.last);
    op->setSourceRange(r.last->sourceRange());
    op->output()->setType(c10::TensorType::get());
    r.last->output()->replaceAllUsesWith(op->output());
    ++report_.resamplings;
  }

  /// The bias of `x + b.reshape([1, .., -1, .., 1])`: b and the dimension it runs along,
  /// counted from the end (so that a tensor of another rank is refused by the op).
  static bool biasOf(Node *add, Value *&x, Value *&b, int64_t &dim) {
    if (add->kind() != c10::aten::add || add->inputs().size() != 3 ||
        constNumber(add->input(2)) != 1.0)
      return false;
    Node *shaped = add->input(1)->node();
    if (!isReshape(shaped) || !usedOnce(add->input(1)))
      return false;
    auto shape = constInts(shaped->input(1));
    if (!shape || std::count(shape->begin(), shape->end(), -1) != 1 ||
        std::count(shape->begin(), shape->end(), 1) != static_cast<long>(shape->size()) - 1)
      return false;
    x = add->input(0);
    b = shaped->input(0);
    dim = (std::find(shape->begin(), shape->end(), -1) - shape->begin()) -
          static_cast<int64_t>(shape->size());
    return true;
  }

  /// The node after `v` in a chain: its only user, taking it as its first input.
  static Node *next(Value *v, c10::Symbol kind) {
    if (!usedOnce(v) || v->uses()[0].user->kind() != kind || v->uses()[0].offset != 0)
      return nullptr;
    return v->uses()[0].user;
  }

  void matchBiasAct(Node *start) {
    Value *x = nullptr, *b = nullptr;
    int64_t dim = 1;
    std::vector<Node *> chain;
    const bool biased = biasOf(start, x, b, dim);
    Value *v = biased ? start->output() : nullptr;
    if (biased)
      chain.push_back(start);
    Node *act = biased ? nullptr : start;
    if (biased)
      act = usedOnce(v) ? v->uses()[0].user : nullptr;
    std::string name = "linear";
    double alpha = 0.0;
    if (act && act->kind() == c10::aten::leaky_relu && act->inputs().size() == 2 &&
        constNumber(act->input(1)) && (!biased || act->input(0) == v)) {
      name = "lrelu";
      alpha = *constNumber(act->input(1));
    } else if (act && act->kind() == c10::aten::relu && act->inputs().size() == 1 &&
               (!biased || act->input(0) == v)) {
      name = "relu";
    } else {
      act = nullptr;
    }
    if (!biased && !act)
      return;
    if (act) {
      if (!biased)
        x = act->input(0);
      chain.push_back(act);
      v = act->output();
    }
    double gain = 1.0, clamp = -1.0;
    if (Node *mul = next(v, c10::aten::mul); mul && constNumber(mul->input(1))) {
      gain = *constNumber(mul->input(1));
      chain.push_back(mul);
      v = mul->output();
    }
    if (Node *c = next(v, c10::aten::clamp);
        c && c->inputs().size() == 3 && constNumber(c->input(1)) && constNumber(c->input(2)) &&
        *constNumber(c->input(1)) == -*constNumber(c->input(2)) && *constNumber(c->input(2)) >= 0) {
      clamp = *constNumber(c->input(2));
      chain.push_back(c);
      v = c->output();
    }
    if (chain.size() < 2)
      return;
    Node *last = chain.back();
    jit::WithInsertPoint point(last);
    std::vector<Value *> inputs = {x,
                                   b ? b : graph_.insertConstant(c10::IValue()),
                                   graph_.insertConstant(dim),
                                   graph_.insertConstant(name),
                                   graph_.insertConstant(alpha),
                                   graph_.insertConstant(gain),
                                   graph_.insertConstant(clamp)};
    Node *op = graph_.create(c10::Symbol::fromQualString("ganc::bias_act"), inputs, 1);
    op->insertBefore(last);
    op->setSourceRange(last->sourceRange());
    op->output()->setType(c10::TensorType::get());
    last->output()->replaceAllUsesWith(op->output());
    consumed_.insert(chain.begin(), chain.end());
    ++report_.biasActs;
  }

  jit::Graph &graph_;
  const std::function<bool(const Value *)> &isParameter_;
  std::set<Node *> consumed_;
  FusionReport report_;
};

} // namespace

FusionReport fuse(jit::Graph &graph, const std::function<bool(const jit::Value *)> &isParameter) {
  return Fuser(graph, isParameter).run();
}

} // namespace ganc::frontend
