// The ganc IR: a module of parameters, buffers and training phases, each phase an SSA graph.
#pragma once

#include "support/Status.h"

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace ganc::ir {

/// The type of an SSA value. Tensors carry a dtype and a shape (dimensions of -1 are unknown);
/// everything else is a named kind ("int", "bool", "list", ...) with optional element types.
struct Type {
  enum class Kind { Tensor, Other };
  Kind kind = Kind::Other;
  /// Tensor element type ("f32", "bf16", "i64", ...) or "" when unknown.
  std::string dtype;
  /// Tensor shape; meaningful only when hasShape.
  std::vector<int64_t> shape;
  bool hasShape = false;
  /// Non-tensor kind: int, float, bool, none, str, device, number, list, tuple, optional,
  /// object, any.
  std::string name;
  /// Element types of list/tuple/optional, or the class name of an object as a single Other.
  std::vector<Type> elements;

  static Type tensor(std::string dtype, std::vector<int64_t> shape);
  static Type unknownTensor(std::string dtype = "");
  static Type other(std::string name, std::vector<Type> elements = {});

  bool isTensor() const { return kind == Kind::Tensor; }
  /// Whether a value of this type can carry a gradient: a floating tensor, or a container that
  /// may hold one. Integer and bool tensors and scalars never do.
  bool mayCarryGradient() const;
  /// Bytes of one element of a tensor dtype; 0 if unknown.
  static int64_t elementSize(const std::string &dtype);
  /// Number of elements of a fully known tensor shape, or -1.
  int64_t numel() const;
  bool operator==(const Type &other) const;
  bool operator!=(const Type &other) const { return !(*this == other); }
  std::string str() const;
};

/// Parses the text form of a type ("f32[64,3,?]", "list<int>", "tensor").
Expected<Type> parseType(const std::string &text);

/// An attribute value on an op: integer, float, string, bool, or a list of integers.
using Attribute = std::variant<int64_t, double, std::string, bool, std::vector<int64_t>>;

struct Op;

/// An SSA value: a phase input, a block argument or an op result.
struct Value {
  std::string name;
  Type type;
  /// The op defining this value; null for inputs and block arguments.
  Op *definingOp = nullptr;
};

/// A sequence of ops with arguments (loop-carried values) and the values it yields.
struct Block {
  std::vector<Value *> arguments;
  std::vector<std::unique_ptr<Op>> ops;
  std::vector<Value *> yields;
};

/// Attributes `backward_reads_<i>` on an op (an operator library's, whose backward ganc.export
/// measured): the operands its backward reads when the gradient flows through operand i. An op
/// with any of them reads nothing through an operand without one.
inline constexpr const char *kBackwardReadsPrefix = "backward_reads_";

/// The ops of a joint graph that are not ATen's: its ports (`ganc.param`, `ganc.buffer`,
/// `ganc.input`, `ganc.seed`, `ganc.constant` read the graph's inputs, by the symbol's name;
/// `ganc.loss`, `ganc.gradient`, `ganc.buffer_out` and `ganc.stat` take its outputs), an item of
/// an op's tuple result (`ganc.item`, attribute `index`), and a bucket's collective
/// (`ganc.all_reduce`, or `ganc.reduce_scatter` with ZeRO 2; attribute `bucket`, operands the
/// bucket's gradients). An ATen op's attribute `view_of` is the operand its result is (a view,
/// an in-place op's self), `overload` its overload where it is not the default.
namespace joint {
inline constexpr const char *kParam = "ganc.param", *kBuffer = "ganc.buffer",
                            *kInput = "ganc.input", *kSeed = "ganc.seed",
                            *kConstant = "ganc.constant", *kLoss = "ganc.loss",
                            *kGradient = "ganc.gradient", *kBufferOut = "ganc.buffer_out",
                            *kStat = "ganc.stat", *kItem = "ganc.item",
                            *kAllReduce = "ganc.all_reduce",
                            *kReduceScatter = "ganc.reduce_scatter";
/// Whether op `name` is a node of the captured graph (an ATen op or ganc.item), not a port or
/// a collective the plan placed.
inline bool isNode(const std::string &name) { return name.rfind("ganc.", 0) != 0 || name == kItem; }
} // namespace joint

/// One operation. Names follow TorchScript ("aten::conv2d", "prim::If"); ganc's own ops are
/// "ganc.param" and "ganc.buffer", whose symbol names the module parameter or buffer they read.
struct Op {
  std::string name;
  /// The qualified parameter/buffer name of ganc.param / ganc.buffer, else empty.
  std::string symbol;
  std::vector<Value *> operands;
  std::vector<Value *> results;
  std::vector<std::pair<std::string, Attribute>> attributes;
  std::vector<Block> regions;
  /// Runs with gradient recording disabled (inside torch.no_grad(), or traced without grad).
  bool noGrad = false;

  const Attribute *attribute(const std::string &key) const;
};

/// A trainable tensor of the module (a parameter or a buffer), named by its qualified path.
struct Tensor {
  std::string name;
  Type type;
  /// The top-level submodule holding it ("generator"), or "" for the module itself.
  std::string owner;
  /// Parameters some phase trains: the optimizer group that steps it (the spec's
  /// `optimizers` key, "generator" or "g_mapping"); "" otherwise.
  std::string group;
  int64_t bytes() const;
};

/// Where a phase input comes from at run time.
struct PhaseInput {
  Value *value = nullptr;
  /// "data", "labels", "normal", "uniform", "categorical", "fade" or "output" (a value an
  /// earlier phase computed, taken detached).
  std::string source;
};

/// Every parameter's slot in a bucket starts at a multiple of this many bytes, so that views
/// into the flat buffer keep the alignment vectorised kernels want.
constexpr int64_t kBucketAlignment = 64;

/// One all-reduce bucket: parameters laid out at aligned byte offsets in one flat buffer.
///
/// With sharded optimizer state (ZeRO) the bucket also has a rank-major layout: rank r owns
/// piece r of every parameter in it (pieceOf), and the buffer is `ranks` shards of
/// `shardBytes` each, shard r holding rank r's pieces at the slots' `shardOffset`s, so a
/// reduce-scatter leaves each rank exactly the averaged gradient of what it steps, and an
/// all-gather of the shards rebuilds every parameter.
struct Bucket {
  struct Slot {
    std::string parameter;
    int64_t offset = 0; // bytes from the start of the bucket
    int64_t bytes = 0;
    /// Sharded: bytes from the start of each shard to this parameter's piece (0 unsharded).
    int64_t shardOffset = 0;
  };
  std::string dtype;
  std::string device;
  int64_t bytes = 0; // total size including alignment padding
  /// Sharded: the bytes of one rank's shard (aligned); 0 when the plan is not sharded.
  int64_t shardBytes = 0;
  std::vector<Slot> slots;
};

/// The elements of a parameter one rank owns under sharding: the balanced split of its
/// `elements` (in memory order) over `ranks`, the first elements % ranks ranks one more.
struct Piece {
  int64_t begin = 0;
  int64_t length = 0;
};
Piece pieceOf(int64_t elements, int64_t ranks, int64_t rank);

/// When a bucket is all-reduced: right after `afterParameter`'s gradient is ready.
struct ScheduledAllReduce {
  int bucket = 0;
  std::string afterParameter;
};

/// torch.nn.utils.clip_grad_norm_ over one optimizer group's used, all-reduced gradients,
/// before that optimizer steps.
struct ClipGradNorm {
  /// The optimizer group.
  std::string group;
  double maxNorm = 0;
  /// The p of the p-norm; infinity for the max norm.
  double normType = 2.0;
};

/// A dynamic loss scaler (torch.amp.GradScaler): phases that name it scale their loss by it,
/// unscale their all-reduced gradients, skip the step on inf/NaN and update it.
struct LossScaler {
  std::string name;
  double initScale = 65536.0;
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
};

/// How a phase is named in a plan and at run time: "name", or "name@stage" for its
/// specialisation for a stage of a progressively grown GAN.
inline std::string phaseKey(const std::string &name, const std::string &stage) {
  return stage.empty() ? name : name + "@" + stage;
}

/// Whether `name` is `path` or lies inside it: "generator.mapping.0.weight" is within
/// "generator.mapping" and "generator", not within "gen".
bool isWithin(const std::string &name, const std::string &path);

/// A pattern the fusion left alone in a phase, and why (with where, where known).
struct NotFused {
  std::string pattern;
  std::string why;
};

/// One training phase: a method returning a scalar loss, the submodules it updates, and the
/// facts passes derive about it.
struct Phase {
  std::string name;
  std::string method;
  std::vector<std::string> updates;
  int64_t interval = 1;
  /// The stage of a progressively grown GAN this phase was specialised for; empty if the
  /// GAN has no stages.
  std::string stage;
  /// Micro-batches per step (gradient accumulation): the first accumulate-1 backward passes
  /// only accumulate locally, the last one all-reduces; each loss is divided by accumulate.
  int64_t accumulate = 1;
  /// The autocast dtype of the forward ("bf16", "f16"), or "" for none (float32).
  std::string autocast;
  /// Gradient clipping of updated submodules, applied after the all-reduce.
  std::vector<ClipGradNorm> clips;
  /// The loss scaler of the phase ("" for none).
  std::string lossScaler;
  /// The sections (phases without a loss that run earlier in the step) whose graph this
  /// phase's backward continues into: their ops come first in the body, so the passes see
  /// every parameter that backward reaches. The runtime runs each section once per step.
  std::vector<std::string> through;
  /// What the method hands to later phases of the step besides its loss (entries of the
  /// dict of its `(loss, dict)`), taken detached.
  std::vector<std::string> outputs;
  /// What the runtime fuses in the phase's graph (ganc::upfirdn2d and ganc::bias_act nodes
  /// it makes), and what it leaves alone; `ganc compile --fusion off` records none.
  int64_t fusedResamplings = 0;
  int64_t fusedBiasActs = 0;
  std::vector<NotFused> notFused;
  /// A phase that differentiates inside itself (R1, path length): whose double backward its
  /// grouped convolutions take, as ganc::convolution: "filters" (ganc's where the weight takes
  /// no gradient), "grouped" (ganc's for every one); "" runs PyTorch's. Decided by `ganc
  /// compile`, set by `ganc train --double-backward`.
  std::string doubleBackward;
  /// The grouped convolutions the joint graph was captured with as ganc::convolution: its
  /// double backward is ganc's for those whose weight takes no gradient ("filters"); -1 where
  /// it was captured with PyTorch's (or there is no joint graph).
  int64_t jointGroupedConvolutions = -1;
  /// This phase's bucket caps (0: the module's); `ganc compile --bucket-cap-mb auto` sets them.
  int64_t bucketCapBytes = 0;
  int64_t firstBucketCapBytes = 0;
  /// Autotuned caps: the world size they were chosen for, and the communication left exposed
  /// after backward that the simulator predicts there with them and with DDP's 25 MiB / 1 MiB.
  int64_t tunedRanks = 0;
  double tunedExposedSeconds = 0;
  double defaultExposedSeconds = 0;
  std::vector<PhaseInput> inputs;
  Block body;
  Value *loss = nullptr;
  /// The phase's joint graph (docs/ir.md, "Joint graphs in the plan"): its forward, its
  /// autograd.grad calls and its parameter gradients as ATen ops, lowered from the archive's
  /// op list, with ganc's ops (ir::joint) and, once the joint-schedule pass has run,
  /// each bucket's all-reduce placed after the op that completes its last gradient. A scope
  /// of its own: it reads none of `body`'s values. Empty for a phase captured without one.
  Block joint;

  // Facts added by passes; empty until the pass has run.
  bool hasUsedFacts = false;
  std::vector<std::string> used;
  std::vector<std::string> unused;
  /// Used parameters whose every read sits inside a prim::If or prim::Loop region: whether a
  /// step reaches them is decided by data, so the runtime checks it per step (a parameter no
  /// rank reached keeps grad None and is not stepped, as in eager DDP).
  std::vector<std::string> conditional;
  std::vector<std::string> readyOrder;
  std::vector<Bucket> buckets;
  std::vector<ScheduledAllReduce> schedule;
  /// Why the phase must run eagerly instead of as a captured graph; empty if capture is safe.
  std::string eagerReason;
  bool hasCaptureFacts = false;

  /// What names the phase in a plan and at run time: "name", or "name@stage".
  std::string key() const { return phaseKey(name, stage); }
  /// Whether the joint graph is the phase's only code (ganc's own archive, exported without
  /// TorchScript): no forward graph, no `loss` value; its ganc.loss is the loss.
  bool onlyJoint() const { return !loss && body.ops.empty() && !joint.ops.empty(); }
  /// Why a run that may choose (`ganc train --executor auto`) takes TorchScript for this phase
  /// although it has a joint graph: the plan fuses in it (the joint graph does not fuse yet),
  /// or its double backward is one the joint graph was not captured with (`grouped`, or
  /// `pytorch`'s per-group convolutions where it has ganc's). "" where it takes the joint graph
  /// (or has none).
  std::string jointDeclined() const;
  /// Whether the phase shares values with others of its step: it takes one an earlier phase
  /// computed (an `output` input, or a section it runs `through`) or hands one on. On CUDA
  /// such a step's phases and sections are captured together, as one graph.
  bool sharesValues() const {
    if (!through.empty() || !outputs.empty())
      return true;
    for (const PhaseInput &input : inputs)
      if (input.source == "output")
        return true;
    return false;
  }
  /// Whether the phase trains parameter `name`: one of `updates` is the parameter itself or a
  /// submodule holding it ("discriminator.head" trains "discriminator.head.0.weight").
  bool trains(const std::string &name) const;
  /// Creates a value owned by this phase.
  Value *newValue(std::string name, Type type);
  /// Visits every op, nested regions included, in program (pre-)order.
  template <typename F> void walk(F &&visit) const { walkBlock(body, visit); }

private:
  template <typename F> static void walkBlock(const Block &block, F &visit) {
    for (const auto &op : block.ops) {
      visit(*op);
      for (const auto &region : op->regions)
        walkBlock(region, visit);
    }
  }
  std::vector<std::unique_ptr<Value>> values_;
};

/// A stage of a progressively grown GAN: its name and the submodules it adds ("grows").
struct Stage {
  std::string name;
  std::vector<std::string> grows;
};

/// The whole GAN: its trainable tensors and its phases.
struct Module {
  std::string name;
  /// Fingerprint of the archive (code, spec, parameter names and shapes) the IR came from.
  std::string identity;
  /// What ganc train needs of the spec besides what the plan says itself: the spec's JSON
  /// less each phase's interval, micro-batches, precision and loss scaler, the loss scalers,
  /// clipping and the ZeRO stage (the phase and module attributes hold those). Optimizer
  /// hyper-parameters and schedules, data, sampling, EMA, stages and policies. Empty in a plan
  /// written before plans carried it (the archive's spec is read then).
  std::string spec;
  /// Bucket size caps the bucketing pass used (0 until it ran): the first bucket's and the rest.
  int64_t firstBucketCapBytes = 0;
  int64_t bucketCapBytes = 0;
  /// Sharded optimizer state: 0 (off), 1 (optimizer state sharded, gradients all-reduced)
  /// or 2 (gradients reduce-scattered too). The spec's `zero`, or compile's --zero.
  int zeroStage = 0;
  /// The highest stage there is (the spec's `zero` and --zero take 0 to it).
  static constexpr int kMaxZeroStage = 2;
  /// The world size the buckets' shards are planned for (0: not planned; the runtime plans
  /// them for its world size at start-up).
  int64_t shardRanks = 0;
  std::vector<Tensor> parameters;
  std::vector<Tensor> buffers;
  /// The stages of a progressively grown GAN in training order (empty: no stages); every
  /// phase is specialised once per stage.
  std::vector<Stage> stages;
  /// Dynamic loss scalers the phases name.
  std::vector<LossScaler> lossScalers;
  std::vector<std::unique_ptr<Phase>> phases;

  const Tensor *findParameter(const std::string &name) const;
  /// The phase with this key ("d", or "d@8x8" for a stage's specialisation).
  Phase *findPhase(const std::string &key) const;
  /// The parameters some phase of `stage` uses ("" : the phases of a GAN without stages).
  std::set<std::string> usedInStage(const std::string &stage) const;
};

/// Prints the module in its stable text form.
std::string print(const Module &module);
/// Parses the text form; print(*parse(text)) == text for printer output.
Expected<std::unique_ptr<Module>> parse(const std::string &text);
/// Checks the IR's invariants (SSA, unique names, facts consistent with each other) and then
/// its model rules (verifyModelRules).
Status verify(const Module &module);
/// Checks the IR's structural invariants only; a failure after a pass is ganc's own bug.
Status verifyInvariants(const Module &module);
/// Checks the rules the user's model must satisfy once passes derived their facts: a stage
/// grows only submodules whose parameters its phases use and no earlier stage's phases use.
/// A failure names the stage, the submodule and the parameter.
Status verifyModelRules(const Module &module);

} // namespace ganc::ir
