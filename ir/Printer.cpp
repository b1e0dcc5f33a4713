// Prints a module in the stable text form that ir/Parser.cpp reads back.
#include "ir/Module.h"
#include "ir/PhaseAttrs.h"
#include "support/TextFormat.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace ganc::ir {

namespace {

std::string attributeText(const Attribute &attribute) {
  struct Visitor {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return formatDouble(v); }
    std::string operator()(const std::string &v) const { return quote(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::vector<int64_t> &v) const {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i)
        s += (i ? "," : "") + std::to_string(v[i]);
      return s + "]";
    }
  };
  return std::visit(Visitor{}, attribute);
}

/// A name after its sigil: bare where it is letters, digits, '_' and '.', else quoted as a
/// string (a space, a quote, '@', a newline, unicode), which the lexer reads back the same.
std::string nameText(const std::string &name) {
  const bool bare = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  });
  return bare ? name : quote(name);
}

std::string sym(char sigil, const std::string &name) {
  return std::string(1, sigil) + nameText(name);
}

std::string valueList(const std::vector<Value *> &values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i)
    s += (i ? ", " : "") + sym('%', values[i]->name);
  return s;
}

std::string symbolList(const std::vector<std::string> &names, char sigil) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i)
    s += (i ? ", " : "") + (sigil ? sym(sigil, names[i]) : nameText(names[i]));
  return s + "]";
}

class Printer {
public:
  std::string run(const Module &m) {
    line(0, "module " + sym('@', m.name) + " {");
    if (!m.identity.empty())
      line(1, "identity " + quote(m.identity));
    if (!m.spec.empty())
      line(1, "spec " + quote(m.spec));
    if (m.bucketCapBytes)
      line(1, "bucket_cap " + std::to_string(m.bucketCapBytes) + " first " +
                  std::to_string(m.firstBucketCapBytes));
    if (m.zeroStage)
      line(1, "zero " + std::to_string(m.zeroStage) + " ranks " + std::to_string(m.shardRanks));
    for (const Stage &stage : m.stages)
      line(1, "stage " + quote(stage.name) + " grows " + symbolList(stage.grows, 0));
    for (const LossScaler &l : m.lossScalers)
      line(1, "loss_scaler " + quote(l.name) + " init_scale " + formatDouble(l.initScale) +
                  " growth_factor " + formatDouble(l.growthFactor) + " backoff_factor " +
                  formatDouble(l.backoffFactor) + " growth_interval " +
                  std::to_string(l.growthInterval));
    for (const Tensor &p : m.parameters)
      line(1, tensorLine("param", p));
    for (const Tensor &b : m.buffers)
      line(1, tensorLine("buffer", b));
    for (const auto &phase : m.phases)
      printPhase(*phase);
    line(0, "}");
    return out_.str();
  }

private:
  static std::string tensorLine(const char *keyword, const Tensor &t) {
    std::string s = std::string(keyword) + " " + sym('@', t.name) + " : " + t.type.str();
    if (!t.owner.empty())
      s += " owner " + nameText(t.owner);
    if (!t.group.empty())
      s += " group " + nameText(t.group);
    return s;
  }

  void line(int depth, const std::string &text) {
    out_ << std::string(static_cast<size_t>(2 * depth), ' ') << text << "\n";
  }

  void printPhase(const Phase &p) {
    line(1, "phase " + sym('@', p.name) + " {");
    for (const PhaseAttr &attr : phaseAttrs())
      for (const std::string &text : attr.print(p))
        line(2, text);
    for (const PhaseInput &input : p.inputs)
      line(2, "input " + sym('%', input.value->name) + " : " + input.value->type.str() + " from " +
                  input.source);
    // A phase of ganc's own archive has no forward graph: its joint graph is its code.
    if (p.loss || !p.body.ops.empty() || p.joint.ops.empty()) {
      line(2, "graph {");
      printOps(p.body, 3);
      if (p.loss)
        line(3, "return " + sym('%', p.loss->name));
      line(2, "}");
    }
    if (!p.joint.ops.empty()) {
      line(2, "joint {");
      printOps(p.joint, 3);
      line(2, "}");
    }
    if (p.hasUsedFacts) {
      line(2, "used " + symbolList(p.used, '@'));
      line(2, "unused " + symbolList(p.unused, '@'));
      if (!p.conditional.empty())
        line(2, "conditional " + symbolList(p.conditional, '@'));
    }
    if (!p.readyOrder.empty())
      line(2, "ready " + symbolList(p.readyOrder, '@'));
    for (size_t i = 0; i < p.buckets.size(); ++i) {
      const Bucket &b = p.buckets[i];
      line(2, "bucket #" + std::to_string(i) + " " + b.dtype + " " + b.device + " " +
                  std::to_string(b.bytes) +
                  (b.shardBytes ? " shard " + std::to_string(b.shardBytes) : std::string()) + " {");
      for (const Bucket::Slot &slot : b.slots)
        line(3, sym('@', slot.parameter) + " +" + std::to_string(slot.offset) + " " +
                    std::to_string(slot.bytes) +
                    (b.shardBytes ? " shard +" + std::to_string(slot.shardOffset) : std::string()));
      line(2, "}");
    }
    for (const ScheduledAllReduce &s : p.schedule)
      line(2, "allreduce #" + std::to_string(s.bucket) + " after " + sym('@', s.afterParameter));
    if (p.hasCaptureFacts)
      line(2, p.eagerReason.empty() ? "capture graph" : "capture eager " + quote(p.eagerReason));
    line(1, "}");
  }

  void printOps(const Block &block, int depth) {
    for (const auto &op : block.ops)
      printOp(*op, depth);
  }

  void printOp(const Op &op, int depth) {
    std::string s;
    if (!op.results.empty())
      s += valueList(op.results) + " = ";
    if (op.noGrad)
      s += "nograd ";
    s += op.name;
    if (!op.symbol.empty())
      s += " " + sym('@', op.symbol);
    if (!op.operands.empty() || op.symbol.empty())
      s += "(" + valueList(op.operands) + ")";
    if (!op.attributes.empty()) {
      s += " {";
      for (size_t i = 0; i < op.attributes.size(); ++i)
        s += (i ? ", " : "") + op.attributes[i].first + " = " +
             attributeText(op.attributes[i].second);
      s += "}";
    }
    if (!op.results.empty()) {
      s += " : ";
      for (size_t i = 0; i < op.results.size(); ++i)
        s += (i ? ", " : "") + op.results[i]->type.str();
    }
    if (op.regions.empty()) {
      line(depth, s);
      return;
    }
    line(depth, s + " {");
    for (size_t r = 0; r < op.regions.size(); ++r) {
      const Block &region = op.regions[r];
      if (!region.arguments.empty()) {
        std::string args = "^(";
        for (size_t i = 0; i < region.arguments.size(); ++i)
          args += (i ? ", " : "") + sym('%', region.arguments[i]->name) + " : " +
                  region.arguments[i]->type.str();
        line(depth + 1, args + ")");
      }
      printOps(region, depth + 1);
      line(depth + 1, "yield" + (region.yields.empty() ? "" : " " + valueList(region.yields)));
      line(depth, r + 1 < op.regions.size() ? "} {" : "}");
    }
  }

  std::ostringstream out_;
};

} // namespace

std::string print(const Module &module) { return Printer().run(module); }

} // namespace ganc::ir
