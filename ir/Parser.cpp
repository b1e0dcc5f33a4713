// Reads the ganc IR text form (the printer's output, plus `//` comments) back into a Module.
#include "ir/Lexer.h"
#include "ir/Module.h"
#include "ir/PhaseAttrs.h"
#include "support/TextFormat.h"

#include <cctype>
#include <cstdlib>
#include <map>

namespace ganc::ir {

namespace {

class Parser : Lexer {
public:
  explicit Parser(const std::string &text) : Lexer(text) {}

  Expected<std::unique_ptr<Module>> run() {
    auto module = std::make_unique<Module>();
    GANC_TRY(expectWord("module"));
    GANC_TRY(symbol(module->name));
    GANC_TRY(expect('{'));
    while (!peek('}')) {
      std::string word = identifier();
      if (word == "identity") {
        GANC_TRY(string(module->identity));
      } else if (word == "spec") {
        GANC_TRY(string(module->spec));
      } else if (word == "bucket_cap") {
        GANC_TRY(integer(module->bucketCapBytes));
        GANC_TRY(expectWord("first"));
        GANC_TRY(integer(module->firstBucketCapBytes));
      } else if (word == "zero") {
        int64_t stage = 0;
        GANC_TRY(integer(stage));
        module->zeroStage = static_cast<int>(stage);
        GANC_TRY(expectWord("ranks"));
        GANC_TRY(integer(module->shardRanks));
      } else if (word == "stage") {
        Stage stage;
        GANC_TRY(string(stage.name));
        GANC_TRY(expectWord("grows"));
        GANC_TRY(symbolList(stage.grows, false));
        module->stages.push_back(std::move(stage));
      } else if (word == "loss_scaler") {
        GANC_TRY(parseLossScaler(*module));
      } else if (word == "param" || word == "buffer") {
        Tensor t;
        GANC_TRY(symbol(t.name));
        GANC_TRY(expect(':'));
        auto type = typeText();
        if (!type)
          return type.status();
        t.type = type.take();
        if (peekWord("owner")) {
          identifier();
          t.owner = bareName();
        }
        if (peekWord("group")) {
          identifier();
          t.group = bareName();
        }
        (word == "param" ? module->parameters : module->buffers).push_back(std::move(t));
      } else if (word == "phase") {
        auto phase = std::make_unique<Phase>();
        GANC_TRY(parsePhase(*phase, *module));
        module->phases.push_back(std::move(phase));
      } else {
        return error("expected 'identity', 'spec', 'bucket_cap', 'zero', 'stage', 'loss_scaler', "
                     "'param', 'buffer' "
                     "or 'phase', got '" +
                     word + "'");
      }
    }
    GANC_TRY(expect('}'));
    skipSpace();
    if (pos_ != text_.size())
      return error("text after the end of the module");
    return module;
  }

private:
  /// `loss_scaler "name" init_scale x growth_factor x backoff_factor x growth_interval n`.
  Status parseLossScaler(Module &module) {
    LossScaler l;
    GANC_TRY(string(l.name));
    GANC_TRY(expectWord("init_scale"));
    GANC_TRY(number(l.initScale));
    GANC_TRY(expectWord("growth_factor"));
    GANC_TRY(number(l.growthFactor));
    GANC_TRY(expectWord("backoff_factor"));
    GANC_TRY(number(l.backoffFactor));
    GANC_TRY(expectWord("growth_interval"));
    GANC_TRY(integer(l.growthInterval));
    module.lossScalers.push_back(l);
    return Status::ok();
  }

  /// A type runs until a ',' or '{' or end of line outside of brackets.
  Expected<Type> typeText() {
    skipSpace();
    size_t start = pos_;
    int depth = 0;
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == '[' || c == '<')
        ++depth;
      else if (c == ']' || c == '>')
        --depth;
      else if (depth == 0 && (c == ',' || c == '{' || c == ')' || std::isspace(c)))
        break;
      ++pos_;
    }
    auto type = parseType(text_.substr(start, pos_ - start));
    if (!type)
      return error(type.status().message());
    return type;
  }

  // ---- values ------------------------------------------------------------------------------

  Expected<Value *> use() {
    std::string name;
    GANC_TRY(sigilName('%', name));
    auto it = scope_.find(name);
    if (it == scope_.end())
      return error("use of undefined value %" + name);
    return it->second;
  }

  Expected<Value *> define(Phase &phase, const std::string &name, Type type) {
    if (scope_.count(name))
      return error("value %" + name + " is defined twice");
    Value *v = phase.newValue(name, std::move(type));
    scope_[name] = v;
    return v;
  }

  Status valueList(std::vector<Value *> &out, char close) {
    if (peek(close))
      return Status::ok();
    while (true) {
      auto v = use();
      if (!v)
        return v.status();
      out.push_back(*v);
      if (!peek(','))
        return Status::ok();
      ++pos_;
    }
  }

  Status symbolList(std::vector<std::string> &out, bool sigil) {
    GANC_TRY(expect('['));
    while (!peek(']')) {
      std::string name;
      if (sigil)
        GANC_TRY(symbol(name));
      else
        name = bareName();
      if (name.empty())
        return error("expected a name in list");
      out.push_back(name);
      if (peek(','))
        ++pos_;
    }
    return expect(']');
  }

  // ---- phases and ops ----------------------------------------------------------------------

  /// The IR parser's tokens, as the phase attribute table (PhaseAttrs.def) reads them.
  struct Reader final : AttrReader {
    explicit Reader(Parser &parser) : p(parser) {}
    Status integer(int64_t &out) override { return p.integer(out); }
    Status number(double &out) override { return p.number(out); }
    Status string(std::string &out) override { return p.string(out); }
    Status word(std::string &out) override {
      out = p.identifier();
      return out.empty() ? p.error("expected a word") : Status::ok();
    }
    Status nameList(std::vector<std::string> &out) override { return p.symbolList(out, false); }
    Status expectWord(const std::string &word) override { return p.expectWord(word); }
    Parser &p;
  };

  Status parsePhase(Phase &p, const Module &m) {
    scope_.clear();
    GANC_TRY(symbol(p.name));
    GANC_TRY(expect('{'));
    Reader reader(*this);
    while (!peek('}')) {
      std::string word = identifier();
      if (const PhaseAttr *attr = findPhaseAttr(word)) {
        GANC_TRY(attr->parse(p, reader));
      } else if (word == "input") {
        auto v = typedValue(p);
        if (!v)
          return v.status();
        GANC_TRY(expectWord("from"));
        PhaseInput input;
        input.source = identifier();
        input.value = *v;
        p.inputs.push_back(input);
      } else if (word == "graph") {
        GANC_TRY(expect('{'));
        GANC_TRY(parseOps(p, p.body, /*topLevel=*/true));
        GANC_TRY(expect('}'));
      } else if (word == "joint") {
        // A graph of its own: its names may repeat the forward graph's.
        std::map<std::string, Value *> forward;
        std::swap(forward, scope_);
        GANC_TRY(expect('{'));
        if (peekWord("return"))
          return error("a joint graph has no 'return': its loss is the operand of ganc.loss");
        GANC_TRY(parseOps(p, p.joint, /*topLevel=*/true, /*joint=*/true));
        GANC_TRY(expect('}'));
        std::swap(forward, scope_);
      } else if (word == "used") {
        p.hasUsedFacts = true;
        GANC_TRY(symbolList(p.used, true));
      } else if (word == "unused") {
        p.hasUsedFacts = true;
        GANC_TRY(symbolList(p.unused, true));
      } else if (word == "conditional") {
        GANC_TRY(symbolList(p.conditional, true));
      } else if (word == "ready") {
        GANC_TRY(symbolList(p.readyOrder, true));
      } else if (word == "bucket") {
        GANC_TRY(parseBucket(p));
      } else if (word == "allreduce") {
        ScheduledAllReduce s;
        int64_t index = 0;
        GANC_TRY(expect('#'));
        GANC_TRY(integer(index));
        s.bucket = static_cast<int>(index);
        GANC_TRY(expectWord("after"));
        GANC_TRY(symbol(s.afterParameter));
        p.schedule.push_back(s);
      } else if (word == "capture") {
        p.hasCaptureFacts = true;
        std::string mode = identifier();
        if (mode == "eager")
          GANC_TRY(string(p.eagerReason));
        else if (mode != "graph")
          return error("expected 'graph' or 'eager' after 'capture'");
      } else {
        return error("unexpected '" + word + "' in phase @" + p.name);
      }
    }
    (void)m;
    return expect('}');
  }

  Status parseBucket(Phase &p) {
    Bucket b;
    int64_t index = 0;
    GANC_TRY(expect('#'));
    GANC_TRY(integer(index));
    if (index != static_cast<int64_t>(p.buckets.size()))
      return error("bucket #" + std::to_string(index) + " out of order");
    b.dtype = identifier();
    b.device = identifier();
    GANC_TRY(integer(b.bytes));
    if (peekWord("shard")) {
      identifier();
      GANC_TRY(integer(b.shardBytes));
    }
    GANC_TRY(expect('{'));
    while (!peek('}')) {
      Bucket::Slot slot;
      GANC_TRY(symbol(slot.parameter));
      GANC_TRY(expect('+'));
      GANC_TRY(integer(slot.offset));
      GANC_TRY(integer(slot.bytes));
      if (b.shardBytes) {
        GANC_TRY(expectWord("shard"));
        GANC_TRY(expect('+'));
        GANC_TRY(integer(slot.shardOffset));
      }
      b.slots.push_back(slot);
    }
    GANC_TRY(expect('}'));
    p.buckets.push_back(std::move(b));
    return Status::ok();
  }

  /// Ops until '}' (top level: until 'return'; regions: until 'yield').
  Status parseOps(Phase &p, Block &block, bool topLevel, bool joint = false) {
    while (true) {
      if (joint && peekWord("return"))
        return error("a joint graph has no 'return': its loss is the operand of ganc.loss");
      if (topLevel && peekWord("return")) {
        identifier();
        auto v = use();
        if (!v)
          return v.status();
        p.loss = *v;
        return Status::ok();
      }
      if (topLevel && peek('}'))
        return Status::ok();
      if (!topLevel && peekWord("yield")) {
        identifier();
        if (peek('%'))
          GANC_TRY(valueList(block.yields, '\n'));
        return Status::ok();
      }
      GANC_TRY(parseOp(p, block));
    }
  }

  Status parseOp(Phase &p, Block &block) {
    skipSpace();
    const int opLine = line_;
    auto op = std::make_unique<Op>();
    std::vector<std::string> resultNames;
    if (peek('%')) {
      while (true) {
        std::string name;
        GANC_TRY(sigilName('%', name));
        resultNames.push_back(name);
        if (!peek(','))
          break;
        ++pos_;
      }
      GANC_TRY(expect('='));
    }
    if (peekWord("nograd")) {
      identifier();
      op->noGrad = true;
    }
    op->name = identifier();
    if (op->name.empty())
      return error("expected an op name");
    if (peek('@'))
      GANC_TRY(symbol(op->symbol));
    if (peek('(')) {
      ++pos_;
      GANC_TRY(valueList(op->operands, ')'));
      GANC_TRY(expect(')'));
    }
    // Attributes are "{ key = value, ... }"; a region also starts with '{' but only after the
    // result types, so an attribute dictionary is recognised by its "key =" shape.
    if (peek('{') && looksLikeAttributes())
      GANC_TRY(parseAttributes(*op));
    std::vector<Type> types;
    if (peek(':')) {
      ++pos_;
      GANC_TRY(typeList(types));
    }
    if (types.size() != resultNames.size())
      return errorAt(opLine, "op " + op->name + " has " + std::to_string(resultNames.size()) +
                                 " results but " + std::to_string(types.size()) + " types");
    // Results are visible after the op (SSA), so regions are parsed first.
    while (peek('{')) {
      ++pos_;
      Block region;
      GANC_TRY(parseRegion(p, region));
      op->regions.push_back(std::move(region));
    }
    for (size_t i = 0; i < resultNames.size(); ++i) {
      auto v = define(p, resultNames[i], types[i]);
      if (!v)
        return v.status();
      (*v)->definingOp = op.get();
      op->results.push_back(*v);
    }
    block.ops.push_back(std::move(op));
    return Status::ok();
  }

  /// "type, type, ..." after an op's ':'.
  Status typeList(std::vector<Type> &types) {
    while (true) {
      auto type = typeText();
      if (!type)
        return type.status();
      types.push_back(type.take());
      if (!peek(','))
        return Status::ok();
      ++pos_;
    }
  }

  /// "%name : type", defined as a new value of the phase.
  Expected<Value *> typedValue(Phase &p) {
    std::string name;
    GANC_TRY(sigilName('%', name));
    GANC_TRY(expect(':'));
    auto type = typeText();
    if (!type)
      return type.status();
    return define(p, name, type.take());
  }

  /// A region after its '{': optional block arguments "^(%a : t, ...)", ops, then '}'.
  Status parseRegion(Phase &p, Block &region) {
    if (peek('^')) {
      ++pos_;
      GANC_TRY(expect('('));
      while (!peek(')')) {
        auto v = typedValue(p);
        if (!v)
          return v.status();
        region.arguments.push_back(*v);
        if (peek(','))
          ++pos_;
      }
      GANC_TRY(expect(')'));
    }
    GANC_TRY(parseOps(p, region, /*topLevel=*/false));
    return expect('}');
  }

  bool looksLikeAttributes() {
    size_t save = pos_;
    int saveLine = line_;
    ++pos_;
    std::string key = identifier();
    bool result = !key.empty() && peek('=');
    pos_ = save;
    line_ = saveLine;
    return result;
  }

  Status parseAttributes(Op &op) {
    GANC_TRY(expect('{'));
    while (!peek('}')) {
      std::string key = identifier();
      if (key.empty())
        return error("expected an attribute name");
      GANC_TRY(expect('='));
      skipSpace();
      Attribute value;
      if (peek('"')) {
        std::string s;
        GANC_TRY(string(s));
        value = s;
      } else if (peek('[')) {
        ++pos_;
        std::vector<int64_t> list;
        while (!peek(']')) {
          int64_t v = 0;
          GANC_TRY(integer(v));
          list.push_back(v);
          if (peek(','))
            ++pos_;
        }
        ++pos_;
        value = list;
      } else if (peekWord("true") || peekWord("false")) {
        value = identifier() == "true";
      } else {
        size_t start = pos_;
        while (pos_ < text_.size() &&
               (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '-' ||
                text_[pos_] == '+' || text_[pos_] == '.'))
          ++pos_;
        std::string number = text_.substr(start, pos_ - start);
        if (number.empty())
          return error("expected an attribute value for '" + key + "'");
        if (number.find_first_of(".eEn") != std::string::npos)
          value = std::strtod(number.c_str(), nullptr);
        else if (auto integer = parseInt64(number))
          value = *integer;
        else
          return error("attribute '" + key + "': " + number + " is not an int64");
      }
      op.attributes.emplace_back(key, value);
      if (peek(','))
        ++pos_;
    }
    return expect('}');
  }

  std::map<std::string, Value *> scope_;
};

} // namespace

Expected<std::unique_ptr<Module>> parse(const std::string &text) { return Parser(text).run(); }

} // namespace ganc::ir
