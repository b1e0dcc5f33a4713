// The fusion of a phase graph's resampling and bias + activation into ganc's ops (see
// Fusion.h). Each match is checked structurally, value by value: constants where the op needs
// a number, sizes read from the very tensor the pattern resamples, single uses of everything
// it consumes. What fails a check is left as it is (a near miss where it looked like one).
#include "frontend/Fusion.h"
#include "frontend/FusionMatch.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <set>

namespace ganc::frontend {
namespace {

namespace jit = torch::jit;
using namespace match;

/// One resampling found at a convolution: what ganc::upfirdn2d takes, and the node whose
/// output it replaces.
struct Resampling {
  Value *input = nullptr, *filter = nullptr, *padding = nullptr;
  std::vector<int64_t> constPadding;
  std::array<int64_t, 2> up{1, 1}, down{1, 1};
  int64_t row = -1;     // a separable filter's pass: the 1-D filter as a row (0) or a column (1)
  bool cropped = false; // a crop after the pad, taken into constPadding
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
  /// `repeats`, nullptr where not repeated), through a dtype conversion or not; or one pass of
  /// a separable filter, a 1-D f unsqueezed to [1, 1, k], repeated and unsqueezed at 2 (a row,
  /// `row` = 0) or 3 (a column, `row` = 1). `row` is -1 for a 2-D filter.
  static Value *filterOf(Value *weight, Value *&repeats, int64_t &row) {
    repeats = nullptr;
    row = -1;
    if (weight->node()->kind() == c10::aten::to)
      weight = weight->node()->input(0);
    size_t rank = 4;
    if (Node *u = weight->node(); u->kind() == c10::aten::unsqueeze &&
                                  (constInt(u->input(1)) == 2 || constInt(u->input(1)) == 3) &&
                                  u->input(0)->node()->kind() == c10::aten::repeat) {
      row = *constInt(u->input(1)) - 2;
      rank = 3;
      weight = u->input(0);
    }
    if (weight->node()->kind() == c10::aten::repeat) {
      Value *list = weight->node()->input(1);
      Value *item = nullptr;
      std::optional<int64_t> c;
      if (listLength(list) != rank)
        return nullptr;
      for (size_t i = 1; i < rank; ++i)
        if (!listItem(list, i, item, c) || c != 1)
          return nullptr;
      listItem(list, 0, repeats, c);
      if (!repeats)
        repeats = list; // a constant count: checked against groups by the caller
      weight = weight->node()->input(0);
    } else if (rank == 3) {
      return nullptr;
    }
    Node *n = weight->node();
    if (n->kind() == c10::aten::unsqueeze && constInt(n->input(1)) == 1 &&
        n->input(0)->node()->kind() == c10::aten::unsqueeze &&
        constInt(n->input(0)->node()->input(1)) == 0)
      return n->input(0)->node()->input(0);
    if (isReshape(n) && rank == 4) {
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
    int64_t row = -1;
    Value *filter = filterOf(conv->weight, repeats, row);
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
    r.row = row;
    r.down = {stride->back(), stride->front()};
    r.last = n;
    if (allEqual(stride, 1))
      absorbSlices(r);
    const std::vector<int64_t> p =
        padding->size() == 1 ? std::vector<int64_t>(2, padding->front()) : *padding;
    r.constPadding = {p[1], p[1], p[0], p[0]};
    r.input = conv->input;
    if (allEqual(padding, 0)) {
      absorbCrop(r);
      if (!r.cropped)
        absorbPad(r);
    }
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

  /// F.pad(x, [x0, x1, y0, y1]) then x[:, :, a : x.shape[2] - b, c : x.shape[3] - d] before
  /// the convolution (StyleGAN3's reference upfirdn2d crops for negative padding): a constant
  /// padding less the crop, negative where it crops. Left alone unless the slices end at a
  /// pad of constants.
  static void absorbCrop(Resampling &r) {
    Value *v = r.input;
    std::array<int64_t, 4> crop{0, 0, 0, 0};
    std::vector<Node *> slices;
    while (v->node()->kind() == c10::aten::slice && usedOnce(v) &&
           v->node()->inputs().size() == 5) {
      Node *s = v->node();
      auto dim = constInt(s->input(1)), step = constInt(s->input(4));
      auto start = isNone(s->input(2)) ? std::optional<int64_t>(0) : constInt(s->input(2));
      if (!dim || step != 1 || !start || *start < 0)
        return;
      const int64_t d = *dim < 0 ? *dim + 4 : *dim;
      std::optional<int64_t> end;
      if (isNone(s->input(3)) || constInt(s->input(3)).value_or(0) >= (int64_t{1} << 62))
        end = 0;
      // The end's size may be read from any tensor below, down to the pad, whose slices in
      // between cut other dimensions.
      for (Value *x = s->input(0); !end; x = x->node()->input(0)) {
        end = sizeMinus(s->input(3), x, d);
        if (x->node()->kind() != c10::aten::slice || constInt(x->node()->input(1)) == d ||
            constInt(x->node()->input(1)) == d - 4)
          break;
      }
      if (!end || (d < 2 && (*start != 0 || *end != 0)))
        return;
      if (d >= 2) {
        crop[d == 3 ? 0 : 2] += *start;
        crop[d == 3 ? 1 : 3] += *end;
      }
      slices.push_back(s);
      v = s->input(0);
    }
    // The pad's other uses may only read its sizes (for the slices' ends).
    const auto sizesOnly = [&](Value *padded) {
      return std::all_of(padded->uses().begin(), padded->uses().end(), [&](const jit::Use &u) {
        return u.user == slices.back() || u.user->kind() == c10::aten::size;
      });
    };
    Node *pad = v->node();
    auto p =
        !slices.empty() && isPad(pad) && sizesOnly(v) ? constInts(pad->input(1)) : std::nullopt;
    if (!p || p->size() != 4u)
      return;
    r.constPadding = {(*p)[0] - crop[0], (*p)[1] - crop[1], (*p)[2] - crop[2], (*p)[3] - crop[3]};
    r.input = pad->input(0);
    r.cropped = true;
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
    // A separable filter's second pass resamples the first's output: the same channels.
    static const c10::Symbol upfirdn2d = c10::Symbol::fromQualString("ganc::upfirdn2d");
    for (Value *v : {input, convInput}) {
      for (; v; v = v->node()->kind() == upfirdn2d ? v->node()->input(0) : nullptr)
        if (isSizeOf(repeats, v, 1))
          return true;
    }
    return false;
  }

  void replaceResampling(const Resampling &r) {
    jit::WithInsertPoint point(r.last);
    Value *padding = r.padding ? r.padding : graph_.insertConstant(r.constPadding);
    Value *filter = r.filter;
    if (r.row >= 0) // [1, k] for a row pass, [k, 1] for a column pass
      filter = graph_.insert(c10::aten::unsqueeze, {r.filter, r.row == 0 ? 0 : 1});
    std::vector<Value *> inputs = {
        r.input,
        filter,
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
