// The rewrite of a twice-differentiated phase's grouped convolutions into ganc::convolution
// (ops/Convolution.cpp holds the op and its autograd; DoubleBackward.h says why).
#include "frontend/DoubleBackward.h"

#include <torch/csrc/jit/ir/constants.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ganc::frontend {

namespace {

namespace jit = torch::jit;

/// Where a convolution node keeps each argument of ganc::convolution.
struct ConvolutionNode {
  bool full = false;      // aten::_convolution, aten::convolution: the same first 9 inputs
  bool transpose = false; // aten::conv_transposeNd
  int64_t dims = 0;       // convNd, conv_transposeNd: N
};

std::optional<ConvolutionNode> convolutionNode(const jit::Node *node) {
  const std::string kind = node->kind().toQualString();
  if (kind == "aten::_convolution" || kind == "aten::convolution")
    return ConvolutionNode{true, false, 0};
  for (int64_t n = 1; n <= 3; ++n) {
    if (kind == "aten::conv" + std::to_string(n) + "d")
      return ConvolutionNode{false, false, n};
    if (kind == "aten::conv_transpose" + std::to_string(n) + "d")
      return ConvolutionNode{false, true, n};
  }
  return std::nullopt;
}

bool isGroupedConvolution(jit::Node *node) {
  const std::optional<ConvolutionNode> conv = convolutionNode(node);
  if (!conv || node->outputs().size() != 1)
    return false;
  if (!conv->full && !conv->transpose &&
      node->inputs()[4]->type()->kind() == c10::TypeKind::StringType)
    return false; // padding="same" / "valid"
  jit::Value *groups = node->inputs()[conv->full ? 8 : 6];
  const std::optional<c10::IValue> constant = jit::toIValue(groups);
  return !(constant && constant->isInt() && constant->toInt() == 1);
}

void collectGrouped(jit::Block *block, std::vector<jit::Node *> &found) {
  for (jit::Node *node : block->nodes()) {
    if (isGroupedConvolution(node))
      found.push_back(node);
    for (jit::Block *inner : node->blocks())
      collectGrouped(inner, found);
  }
}

bool isDoubleGrad(const jit::Node *node) {
  if (node->kind() != c10::Symbol::fromQualString("aten::grad") || node->inputs().size() < 5)
    return false;
  const std::optional<c10::IValue> createGraph = jit::toIValue(node->inputs()[4]);
  return !(createGraph && createGraph->isBool() && !createGraph->toBool());
}

} // namespace

bool differentiatesTwice(const torch::jit::Graph &graph) {
  const std::function<bool(const jit::Block *)> within = [&](const jit::Block *block) {
    for (const jit::Node *node : block->nodes()) {
      if (isDoubleGrad(node))
        return true;
      for (const jit::Block *inner : node->blocks())
        if (within(inner))
          return true;
    }
    return false;
  };
  return within(graph.block());
}

size_t rewriteGroupedConvolutions(torch::jit::Graph &graph, bool weightGradients) {
  std::vector<jit::Node *> found;
  collectGrouped(graph.block(), found);
  static const c10::Symbol op = c10::Symbol::fromQualString("ganc::convolution");
  for (jit::Node *node : found) {
    const ConvolutionNode conv = *convolutionNode(node);
    const auto in = node->inputs();
    // The op it replaces, with its overload: autocast treats each its own way.
    std::string origin = node->kind().toQualString();
    if (const c10::FunctionSchema *schema = node->maybeSchema())
      if (!schema->overload_name().empty())
        origin += "." + schema->overload_name();
    const jit::WithInsertPoint here(node);
    std::vector<jit::NamedValue> args;
    if (conv.full) {
      args.assign(in.begin(), in.begin() + 9);
      args.emplace_back(graph.insertConstant(weightGradients));
      args.emplace_back(graph.insertConstant(origin));
    } else if (!conv.transpose) { // (input, weight, bias, stride, padding, dilation, groups)
      args = {in[0],
              in[1],
              in[2],
              in[3],
              in[4],
              in[5],
              graph.insertConstant(false),
              graph.insertConstant(std::vector<int64_t>(static_cast<size_t>(conv.dims), 0)),
              in[6],
              graph.insertConstant(weightGradients),
              graph.insertConstant(origin)};
    } else { // (input, weight, bias, stride, padding, output_padding, groups, dilation)
      args = {in[0],
              in[1],
              in[2],
              in[3],
              in[4],
              in[7],
              graph.insertConstant(true),
              in[5],
              in[6],
              graph.insertConstant(weightGradients),
              graph.insertConstant(origin)};
    }
    jit::Value *out = graph.insert(op, args);
    out->setType(node->output()->type());
    out->node()->copyMetadata(node);
    node->output()->replaceAllUsesWith(out);
    node->destroy();
  }
  return found.size();
}

} // namespace ganc::frontend
