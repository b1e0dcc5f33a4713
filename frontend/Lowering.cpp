// Phase lowering: inline, specialise the stage, fold module attributes, probe shapes
// (Shapes.cpp), and translate the TorchScript graph op by op into ganc IR.
#include "frontend/Lowering.h"

#include "frontend/Archive.h"
#include "frontend/DoubleBackward.h"
#include "frontend/IRTypes.h"
#include "frontend/JointLowering.h"
#include "frontend/Sections.h"
#include "frontend/Shapes.h"
#include "frontend/SpecSchema.h"
#include "frontend/SyncBatchNorm.h"
#include "ir/Recipe.h"
#include "support/torch/Dtypes.h"
#include "support/torch/TorchError.h"

#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/lower_tuples.h>
#include <torch/csrc/jit/passes/remove_mutation.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>

namespace ganc::frontend {

namespace jit = torch::jit;

namespace {

/// What a GetAttr chain from `self` reaches.
struct AttrTarget {
  enum class Kind { Module, Parameter, Buffer, Constant, Other } kind = Kind::Other;
  std::string path;
  c10::IValue value;
};

class PhaseLowering {
public:
  /// `stage`: the index of the stage to specialise for, or -1 when the GAN has no stages.
  PhaseLowering(Archive &archive, const PhaseSpec &spec, ir::Module *module, int stage)
      : archive_(archive), spec_(spec), through_(spec.throughSections()), module_(module),
        stage_(stage) {}

  /// An error in this phase (in this stage's specialisation of it).
  Status phaseError(const std::string &message) const {
    return Status::error(message).inPhase(key());
  }

  /// The phase's key: its name, with the stage for a stage's specialisation ("d@8x8").
  std::string key() const {
    const auto &stages = archive_.spec.stages;
    return ir::phaseKey(spec_.name,
                        stage_ >= 0 ? stages->list[static_cast<size_t>(stage_)].name : "");
  }

  /// The method's graph, inlined, with the stage attributes folded and what they make dead
  /// removed: what the runtime runs for a stage.
  Expected<std::shared_ptr<jit::Graph>> specialise() {
    std::shared_ptr<jit::Graph> graph = archive_.module.get_method(spec_.method).graph()->copy();
    if (!through_.empty()) { // the sections' graphs and the method's, as one
      auto joined = throughGraph(archive_, spec_);
      if (!joined)
        return joined.status().inPhase(key());
      graph = joined.take();
    }
    GANC_TRY(inlineAll(*graph));
    if (!through_.empty())
      GANC_TRY(foldDictReads(*graph).inPhase(key()));
    GANC_TRY(foldStage(graph));
    if (!archive_.spec.syncBatchNorm.empty()) {
      resolveAttributes(graph->block(), graph->inputs()[0], true);
      std::map<jit::Value *, std::string> tensors; // parameters and buffers
      for (const auto &[value, target] : targets_)
        if (target.kind == AttrTarget::Kind::Parameter || target.kind == AttrTarget::Kind::Buffer)
          tensors[value] = target.path;
      rewriteSyncBatchNorm(*graph, tensors, archive_.module, archive_.spec.syncBatchNorm,
                           syncRewritten_);
    }
    jit::ConstantPropagation(graph);
    jit::EliminateDeadCode(graph);
    return graph;
  }

  /// Fuses `graph` (see Fusion.h): the report of what it replaced.
  FusionReport fused(jit::Graph &graph) {
    resolveAttributes(graph.block(), graph.inputs()[0], true);
    return fuse(graph, [this](const jit::Value *v) {
      auto found = targets_.find(const_cast<jit::Value *>(v));
      return found != targets_.end() && found->second.kind == AttrTarget::Kind::Parameter;
    });
  }

  Expected<std::unique_ptr<ir::Phase>> run(bool fusion) {
    auto specialised = specialise();
    if (!specialised)
      return specialised.status();
    std::shared_ptr<jit::Graph> graph = specialised.take();
    FusionReport report;
    // On a copy: the IR is the code as written, the runtime runs the fused graph. Phases that
    // continue into sections run their graph as the executor joins it: not fused.
    if (fusion && through_.empty())
      report = fused(*graph->copy());
    // A phase that differentiates inside itself takes ganc's double backward for its grouped
    // convolutions (the runtime's rewrite; --double-backward chooses how). Phases that
    // continue into sections run their graph as the executor joins it: PyTorch's.
    const bool ownDoubleBackward = through_.empty() && differentiatesTwice(*graph);
    foldModuleAttributes(graph);
    // A submodule returning (x, img) packs both into one tuple value; unpacking it at once
    // keeps their gradient paths apart in the IR.
    jit::LowerSimpleTuples(graph);
    jit::ConstantPropagation(graph);
    jit::EliminateDeadCode(graph);
    jit::RemoveTensorMutation(graph);
    jit::EliminateDeadCode(graph);
    // Module paths must be recomputed: the passes above created new values.
    resolveAttributes(graph->block(), graph->inputs()[0], true);
    GANC_TRY(recordShapes(graph));
    auto phase = lower(*graph);
    if (phase) {
      (*phase)->doubleBackward = ownDoubleBackward ? "filters" : "";
      (*phase)->fusedResamplings = report.resamplings;
      (*phase)->fusedBiasActs = report.biasActs;
      for (const NearMiss &miss : report.nearMisses)
        (*phase)->notFused.push_back({miss.pattern, miss.why});
    }
    return phase;
  }

private:
  static size_t countCalls(jit::Block *block) {
    size_t n = 0;
    for (jit::Node *node : block->nodes()) {
      if (node->kind() == c10::prim::CallMethod || node->kind() == c10::prim::CallFunction)
        ++n;
      for (jit::Block *b : node->blocks())
        n += countCalls(b);
    }
    return n;
  }

  /// One Inline round leaves calls that the inlined bodies made; repeat until none is left.
  Status inlineAll(jit::Graph &graph) {
    size_t calls = countCalls(graph.block());
    while (calls > 0) {
      jit::Inline(graph);
      size_t now = countCalls(graph.block());
      if (now >= calls)
        return phaseError("cannot inline every call in method '" + spec_.method +
                          "' (calls through interfaces are not supported)");
      calls = now;
    }
    return Status::ok();
  }

  /// Maps each value produced by a GetAttr chain from `self` to what it names.
  void resolveAttributes(jit::Block *block, jit::Value *self, bool top) {
    if (top) {
      targets_.clear();
      targets_[self] = AttrTarget{AttrTarget::Kind::Module, "", archive_.module._ivalue()};
    }
    for (jit::Node *node : block->nodes()) {
      if (node->kind() == c10::prim::GetAttr) {
        auto parent = targets_.find(node->input());
        if (parent != targets_.end() && parent->second.kind == AttrTarget::Kind::Module) {
          targets_[node->output()] = classify(parent->second, node->s(c10::attr::name));
        }
      }
      for (jit::Block *b : node->blocks())
        resolveAttributes(b, self, false);
    }
  }

  AttrTarget classify(const AttrTarget &parent, const std::string &name) {
    auto object = parent.value.toObject();
    const auto &type = object->type();
    AttrTarget t;
    t.path = parent.path.empty() ? name : parent.path + "." + name;
    auto slot = type->findAttributeSlot(name);
    if (!slot)
      return t;
    t.value = object->getSlot(*slot);
    if (t.value.isModule() || (t.value.isObject() && type->getAttribute(*slot)->is_module()))
      t.kind = AttrTarget::Kind::Module;
    else if (t.value.isNone())
      t.kind = AttrTarget::Kind::Constant; // e.g. a bias=False layer's None parameter
    else if (type->is_parameter(*slot))
      t.kind = AttrTarget::Kind::Parameter;
    else if (type->is_buffer(*slot))
      t.kind = AttrTarget::Kind::Buffer;
    else if (t.value.isBool() || t.value.isInt() || t.value.isDouble() || t.value.isString() ||
             t.value.isNone())
      t.kind = AttrTarget::Kind::Constant;
    return t;
  }

  static void collectSetAttrs(jit::Block *block, std::set<std::string> &names) {
    for (jit::Node *node : block->nodes()) {
      if (node->kind() == c10::prim::SetAttr)
        names.insert(node->s(c10::attr::name));
      for (jit::Block *b : node->blocks())
        collectSetAttrs(b, names);
    }
  }

  /// Replaces every read of a stage attribute by the stage's index. A phase that assigns one
  /// cannot be specialised.
  Status foldStage(std::shared_ptr<jit::Graph> &graph) {
    if (stage_ < 0)
      return Status::ok();
    const StagesSpec &stages = *archive_.spec.stages;
    resolveAttributes(graph->block(), graph->inputs()[0], true);
    std::set<std::string> assigned;
    collectSetAttrs(graph->block(), assigned);
    for (auto &[value, target] : targets_) {
      if (std::find(stages.attributes.begin(), stages.attributes.end(), target.path) ==
          stages.attributes.end())
        continue;
      std::string leaf = target.path.substr(target.path.rfind('.') + 1);
      if (assigned.count(leaf))
        return phaseError("method '" + spec_.method + "' assigns the stage attribute '" +
                          target.path + "'; stages are set by the runtime");
      jit::WithInsertPoint guard(value->node());
      value->replaceAllUsesWith(graph->insertConstant(static_cast<int64_t>(stage_)));
    }
    return Status::ok();
  }

  /// Replaces reads of plain module attributes (self.training, flags, sizes) by constants so
  /// that branches on them fold away, unless the phase itself assigns such an attribute.
  void foldModuleAttributes(std::shared_ptr<jit::Graph> &graph) {
    resolveAttributes(graph->block(), graph->inputs()[0], true);
    std::set<std::string> assigned;
    collectSetAttrs(graph->block(), assigned);
    for (auto &[value, target] : targets_) {
      if (target.kind != AttrTarget::Kind::Constant)
        continue;
      std::string leaf = target.path.substr(target.path.rfind('.') + 1);
      if (assigned.count(leaf))
        continue;
      jit::WithInsertPoint guard(value->node());
      jit::Value *constant = graph->insertConstant(target.value);
      value->replaceAllUsesWith(constant);
    }
  }

  Status recordShapes(const std::shared_ptr<jit::Graph> &graph) {
    auto shapes = probeShapes(archive_, spec_, graph);
    if (!shapes)
      return shapes.status().inPhase(key());
    shapes_ = shapes.take();
    return Status::ok();
  }

  ir::Type typeOf(jit::Value *v) {
    auto it = shapes_.find(v);
    if (it != shapes_.end())
      return it->second;
    return convert(v->type());
  }

  static bool isGradModeObject(jit::Value *v, bool &enables) {
    std::string name = v->type()->str();
    enables = name.find("enable_grad") != std::string::npos;
    return name.find("grad_mode.no_grad") != std::string::npos || enables;
  }

  Expected<std::unique_ptr<ir::Phase>> lower(jit::Graph &graph) {
    auto phase = std::make_unique<ir::Phase>();
    phase_ = phase.get();
    phase->name = spec_.name;
    if (stage_ >= 0)
      phase->stage = archive_.spec.stages->list[static_cast<size_t>(stage_)].name;
    phase->method = spec_.method;
    phase->updates = spec_.updates;
    ir::setRecipe(
        *phase, {spec_.interval, spec_.accumulate, ir::autocastOf(precisionName(spec_.precision))});
    phase->lossScaler = spec_.lossScaler;
    phase->through = through_;
    phase->outputs = spec_.outputs;
    for (size_t i = 0; i < spec_.inputs.size(); ++i) {
      jit::Value *in = graph.inputs()[i + 1];
      ir::PhaseInput input;
      input.value = phase->newValue(in->debugName(), typeOf(in));
      input.source = inputSourceName(spec_.inputs[i].source);
      values_[in] = input.value;
      phase->inputs.push_back(input);
    }
    GANC_TRY(lowerBlock(graph.block(), phase->body, false));
    // A method may return (loss, {name: scalar}): the loss is the tuple's first element; the
    // logged values are no part of what backward differentiates.
    jit::Value *output = graph.outputs()[0];
    if (output->node()->kind() == c10::prim::TupleConstruct)
      output = output->node()->inputs()[0];
    auto loss = values_.find(output);
    if (loss == values_.end())
      return phaseError("the loss is not a lowered value");
    phase->loss = loss->second;
    renumberAnonymousValues(*phase);
    return phase;
  }

  /// TorchScript numbers anonymous values ("%1522") from process-wide counters, so the same
  /// archive lowered twice got different numbers. They are renumbered in program order. (The
  /// graph itself can still differ between runs: TorchScript's constant propagation folds
  /// some lists of constants in one run and not in another.)
  static void renumberAnonymousValues(ir::Phase &phase) {
    int64_t next = 0;
    auto rename = [&](ir::Value *v) {
      if (!v->name.empty() && std::all_of(v->name.begin(), v->name.end(),
                                          [](unsigned char c) { return std::isdigit(c); }))
        v->name = std::to_string(next++);
    };
    std::function<void(ir::Block &)> visit = [&](ir::Block &block) {
      for (ir::Value *argument : block.arguments)
        rename(argument);
      for (auto &op : block.ops) {
        for (ir::Value *result : op->results)
          rename(result);
        for (ir::Block &region : op->regions)
          visit(region);
      }
    };
    for (ir::PhaseInput &input : phase.inputs)
      rename(input.value);
    visit(phase.body);
  }

  /// Appends `op` to `out` with one result, which stands for `output` from now on.
  void emit(std::unique_ptr<ir::Op> op, jit::Value *output, ir::Type type, ir::Block &out) {
    ir::Value *v = phase_->newValue(output->debugName(), std::move(type));
    v->definingOp = op.get();
    op->results.push_back(v);
    values_[output] = v;
    out.ops.push_back(std::move(op));
  }

  /// Grad-mode context managers (torch.no_grad(), enable_grad()) become the noGrad flag of
  /// the ops they enclose. Returns true when `node` was one of their nodes.
  bool lowerGradMode(jit::Node *node, bool &noGrad) {
    auto kind = node->kind();
    bool enables = false;
    if (kind == c10::prim::Enter && isGradModeObject(node->input(), enables)) {
      gradModeStack_.push_back(noGrad);
      noGrad = !enables;
      return true;
    }
    if (kind == c10::prim::Exit && isGradModeObject(node->input(), enables)) {
      if (!gradModeStack_.empty()) {
        noGrad = gradModeStack_.back();
        gradModeStack_.pop_back();
      }
      return true;
    }
    return (kind == c10::prim::CreateObject && isGradModeObject(node->output(), enables)) ||
           (kind == c10::prim::SetAttr && isGradModeObject(node->inputs()[0], enables));
  }

  /// A read of a module attribute: parameters and buffers become ganc.param / ganc.buffer
  /// named by their path; submodules are not values (their parameters are named by path).
  void lowerAttributeRead(jit::Node *node, const AttrTarget &target, ir::Block &out, bool noGrad) {
    if (target.kind == AttrTarget::Kind::Module)
      return;
    auto op = std::make_unique<ir::Op>();
    if (target.kind == AttrTarget::Kind::Parameter || target.kind == AttrTarget::Kind::Buffer) {
      bool isParam = target.kind == AttrTarget::Kind::Parameter;
      op->name = isParam ? "ganc.param" : "ganc.buffer";
      op->symbol = target.path;
      ir::Type type = tensorType(op->symbol, isParam);
      emit(std::move(op), node->output(), std::move(type), out);
      return;
    }
    // Any other attribute (not folded: the phase assigns it, or its type is not a plain
    // constant) stays a read, named by its path.
    op->name = "prim::GetAttr";
    op->noGrad = noGrad;
    op->attributes.emplace_back("name", target.path);
    emit(std::move(op), node->output(), typeOf(node->output()), out);
  }

  Status lowerBlock(jit::Block *block, ir::Block &out, bool noGrad) {
    // The graph's own inputs (self and the phase inputs) are not block arguments.
    for (jit::Value *arg :
         block == block->owningGraph()->block() ? c10::ArrayRef<jit::Value *>() : block->inputs()) {
      ir::Value *v = phase_->newValue(arg->debugName(), typeOf(arg));
      values_[arg] = v;
      out.arguments.push_back(v);
    }
    for (jit::Node *node : block->nodes()) {
      if (lowerGradMode(node, noGrad))
        continue;
      auto target = targets_.find(node->kind() == c10::prim::GetAttr ? node->output() : nullptr);
      if (target != targets_.end()) {
        lowerAttributeRead(node, target->second, out, noGrad);
        continue;
      }
      auto op = std::make_unique<ir::Op>();
      op->name = node->kind().toQualString();
      op->noGrad = noGrad;
      op->attributes = attributesOf(node);
      // An operator library's op: what its backward reads, as ganc.export measured it.
      auto measured = archive_.opBackwardReads.find(op->name);
      if (measured != archive_.opBackwardReads.end())
        for (size_t i = 0; i < measured->second.size(); ++i)
          op->attributes.emplace_back(std::string(ir::kBackwardReadsPrefix) + std::to_string(i),
                                      measured->second[i]);
      for (jit::Value *in : node->inputs()) {
        auto it = values_.find(in);
        if (it == values_.end()) {
          auto t = targets_.find(in);
          std::string what =
              t != targets_.end() ? "module '" + t->second.path + "'" : "%" + in->debugName();
          return phaseError("uses " + what + " as a value, which ganc cannot lower").atOp(op->name);
        }
        op->operands.push_back(it->second);
      }
      for (jit::Block *b : node->blocks()) {
        ir::Block region;
        GANC_TRY(lowerBlock(b, region, noGrad));
        op->regions.push_back(std::move(region));
      }
      for (jit::Value *result : node->outputs()) {
        ir::Value *v = phase_->newValue(result->debugName(), typeOf(result));
        v->definingOp = op.get();
        op->results.push_back(v);
        values_[result] = v;
      }
      out.ops.push_back(std::move(op));
    }
    for (jit::Value *y : block->outputs()) {
      auto it = values_.find(y);
      if (it == values_.end())
        return phaseError("block yields unlowered %" + y->debugName());
      out.yields.push_back(it->second);
    }
    return Status::ok();
  }

  ir::Type tensorType(const std::string &name, bool isParam) {
    const auto &list = isParam ? module_->parameters : module_->buffers;
    for (const ir::Tensor &t : list)
      if (t.name == name)
        return t.type;
    return ir::Type::unknownTensor();
  }

  Archive &archive_;
  /// The phase's spec; for a phase with `through_` sections, with the inputs of the graph
  /// methodGraph() builds.
  PhaseSpec spec_;
  std::vector<std::string> through_;
  ir::Module *module_;
  int stage_;
  ir::Phase *phase_ = nullptr;
  std::map<jit::Value *, AttrTarget> targets_;
  std::map<jit::Value *, ir::Type> shapes_;
  std::map<jit::Value *, ir::Value *> values_;
  std::vector<bool> gradModeStack_;

public:
  /// The submodules whose batch norms specialise() rewrote to ganc::sync_batch_norm.
  std::set<std::string> syncRewritten_;
};

std::string ownerOf(const std::string &name) {
  size_t dot = name.find('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

} // namespace

Expected<std::unique_ptr<ir::Module>> lowerToIR(Archive &archive, bool fusion) {
  auto module = std::make_unique<ir::Module>();
  module->name = archive.spec.name;
  module->identity = archive.identity;
  module->spec = planSpecText(archive.spec.text);
  for (const auto &p : archive.module.named_parameters(/*recurse=*/true)) {
    auto group = archive.groupOf.find(p.name);
    module->parameters.push_back(
        {p.name, ir::Type::tensor(dtypeName(p.value.scalar_type()), p.value.sizes().vec()),
         ownerOf(p.name), group == archive.groupOf.end() ? "" : group->second});
  }
  for (const auto &b : archive.module.named_buffers(/*recurse=*/true))
    module->buffers.push_back(
        {b.name, ir::Type::tensor(dtypeName(b.value.scalar_type()), b.value.sizes().vec()),
         ownerOf(b.name), ""});
  // A GAN with stages gets every phase once per stage, specialised for it.
  if (archive.spec.stages)
    for (const StageSpec &stage : archive.spec.stages->list)
      module->stages.push_back({stage.name, stage.grows});
  module->zeroStage = archive.spec.zero;
  for (const auto &[name, l] : archive.spec.lossScalers)
    module->lossScalers.push_back(
        {name, l.initScale, l.growthFactor, l.backoffFactor, l.growthInterval});
  size_t stages = module->stages.size();
  std::set<std::string> synchronised;
  for (size_t s = 0; s < std::max<size_t>(stages, 1); ++s) {
    for (const PhaseSpec &spec : archive.spec.phases) {
      if (spec.isSection()) { // no IR phase: inlined where its graph is taken
        if (s == 0)
          GANC_TRY(checkSection(archive, spec).inFile(archive.path));
        continue;
      }
      if (!archive.torchscript) { // ganc's own archive: the joint graph is the phase's code
        module->phases.push_back(
            phaseOfJointGraph(archive, spec, stages ? static_cast<int>(s) : -1));
        continue;
      }
      PhaseLowering lowering(archive, spec, module.get(), stages ? static_cast<int>(s) : -1);
      try {
        auto phase = lowering.run(fusion);
        if (!phase)
          return phase.status().inFile(archive.path);
        module->phases.push_back(phase.take());
      } catch (const std::exception &e) {
        return lowering.phaseError(firstLine(e)).inFile(archive.path);
      }
      synchronised.insert(lowering.syncRewritten_.begin(), lowering.syncRewritten_.end());
    }
  }
  // The clipped optimizer groups, in each phase that trains a parameter they step.
  for (const auto &[group, optimizer] : archive.spec.optimizers)
    if (optimizer.clip)
      ir::setClip(*module, group,
                  ir::ClipGradNorm{group, optimizer.clip->maxNorm, optimizer.clip->normType});
  GANC_TRY(checkControllersLogged(archive).inFile(archive.path));
  for (const std::string &sub : archive.spec.syncBatchNorm)
    if (!synchronised.count(sub))
      return Status::error("ganc.json: 'sync_batch_norm' names '" + sub +
                           "', but no phase runs a batch norm of it")
          .inFile(archive.path);
  return module;
}

Expected<std::shared_ptr<torch::jit::Graph>> phaseGraph(Archive &archive, const PhaseSpec &phase,
                                                        int stage, FusionReport *fusion) {
  PhaseLowering lowering(archive, phase, nullptr, stage);
  try {
    auto graph = lowering.specialise();
    if (!graph)
      return graph.status().inFile(archive.path);
    if (fusion)
      *fusion = lowering.fused(**graph);
    return graph;
  } catch (const std::exception &e) {
    return lowering.phaseError(firstLine(e)).inFile(archive.path);
  }
}

} // namespace ganc::frontend
