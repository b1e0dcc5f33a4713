// The eager executor: the phase method under autograd, all-reduces launched from hooks.
#include "backend/cpu/EagerExecutor.h"

#include "support/torch/Collectives.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/utils/tensor_flatten.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <stdexcept>

namespace ganc::backend {

namespace {

/// The plan must describe this model: same parameter names and shapes.
Status checkParameters(const ir::Module &plan, const std::map<std::string, at::Tensor> &model) {
  for (const ir::Tensor &p : plan.parameters) {
    auto it = model.find(p.name);
    if (it == model.end())
      return Status::error("the plan's parameter '" + p.name + "' does not exist in the model");
    if (it->second.sizes().vec() != p.type.shape)
      return Status::error("parameter '" + p.name + "' has shape " + c10::str(it->second.sizes()) +
                           " in the model but " + p.type.str() + " in the plan");
  }
  if (plan.parameters.size() != model.size())
    return Status::error("the model has " + std::to_string(model.size()) +
                         " parameters, the plan " + std::to_string(plan.parameters.size()));
  return Status::ok();
}

} // namespace

Status EagerExecutor::readSeedTypes(PhaseState &state) {
  const JointGraph &graph = state.joint->graph();
  for (const JointPort &port : graph.inputs)
    if (port.kind == "seed" && !port.dtype.empty()) {
      auto dtype = scalarTypeNamed(port.dtype);
      if (!dtype)
        return dtype.status();
      state.seedType = *dtype;
    }
  state.lossType = state.seedType;
  if (!graph.lossDtype().empty()) {
    auto dtype = scalarTypeNamed(graph.lossDtype());
    if (!dtype)
      return dtype.status();
    state.lossType = *dtype;
  }
  return Status::ok();
}

Expected<std::unique_ptr<EagerExecutor>>
EagerExecutor::create(const ir::Module &plan, torch::jit::Module module,
                      c10::intrusive_ptr<c10d::Backend> group, const ExecutorOptions &options) {
  // TorchScript's profiling executor swaps in an optimised graph (autodiff subgraphs,
  // specialisations) after the first calls of a method, which changes results in the last
  // bits: a resumed run would then differ from an uninterrupted one, and both from eager
  // PyTorch. ganc runs every phase through the plain interpreter with eager autograd.
  torch::jit::setGraphExecutorOptimize(false);
  auto e = std::unique_ptr<EagerExecutor>(new EagerExecutor());
  e->module_ = module;
  e->group_ = group;
  e->options_ = options;
  for (const auto &p : module.named_parameters(/*recurse=*/true))
    e->parameters_[p.name] = p.value;
  for (const auto &b : module.named_buffers(/*recurse=*/true)) {
    e->buffers_.push_back(b.value);
    e->buffersByName_[b.name] = b.value;
  }
  GANC_TRY(checkParameters(plan, e->parameters_));
  if (plan.shardRanks > 1 && plan.shardRanks != group->getSize())
    return Status::error("the plan's shards are laid out for " + std::to_string(plan.shardRanks) +
                         " ranks, this run has " + std::to_string(group->getSize()));
  const int zeroStage = plan.shardRanks > 1 ? plan.zeroStage : 0;
  if (zeroStage) {
    // One scratch per dtype for every phase's sharded buffers, as large as the largest
    // phase needs: phases run one after another, and nothing of a run outlives its phase.
    std::map<c10::ScalarType, int64_t> largest;
    for (const auto &phase : plan.phases) {
      auto needed = PhaseReducer::scratchElements(*phase, plan.shardRanks, options.keepGradients);
      if (!needed)
        return needed.status();
      for (const auto &[dtype, elements] : *needed)
        largest[dtype] = std::max(largest[dtype], elements);
    }
    for (const auto &[dtype, elements] : largest)
      e->scratch_[dtype] =
          torch::zeros({elements}, at::TensorOptions(dtype).device(options.device));
  }
  for (const auto &phase : plan.phases) {
    if (!phase->hasUsedFacts || phase->schedule.size() != phase->buckets.size())
      return Status::error("phase '" + phase->key() + "' has not been compiled (no buckets)");
    PhaseState state;
    state.plan = phase.get();
    auto graph = options.phaseGraphs.find(phase->key());
    if (graph != options.phaseGraphs.end())
      state.function =
          std::make_unique<torch::jit::GraphFunction>(phase->key(), graph->second, nullptr);
    else if (!phase->stage.empty() && !options.jointPrograms.count(phase->key()))
      return Status::error("phase '" + phase->key() + "' has no stage-specialised graph");
    auto reducer =
        PhaseReducer::create(*phase, e->parameters_, group, options.device, zeroStage, &e->scratch_,
                             options.keepGradients, options.collectivesOnComputeStream);
    if (!reducer)
      return reducer.status();
    state.reducer = reducer.take();
    if (options.profile) {
      const size_t buckets = phase->buckets.size(), used = state.reducer->usedNames().size();
      state.timeline = options.timelines ? options.timelines(buckets, used)
                                         : std::make_unique<HostTimeline>(buckets, used);
      state.reducer->setTimeline(state.timeline.get());
    }
    // Only the parameters a phase trains (under its `updates` paths) record gradients; the
    // others act as constants (the gradient still flows *through* them to the inputs). Unused
    // trained parameters keep requires_grad, so a gradient the plan did not predict is caught.
    for (const ir::Tensor &p : plan.parameters)
      state.requiresGrad.emplace_back(e->parameters_.at(p.name), phase->trains(p.name));
    auto joint = options.jointPrograms.find(phase->key());
    if (joint != options.jointPrograms.end()) {
      state.joint = joint->second;
      GANC_TRY(readSeedTypes(state).withContext("phase '" + phase->key() + "'"));
      state.jointInputs = e->parameters_;
      state.jointInputs.insert(e->buffersByName_.begin(), e->buffersByName_.end());
    }
    e->phases_[phase->key()] = std::move(state);
  }
  e->hooks_ = std::make_unique<GradReadyHooks>(e->parameters_);
  return e;
}

EagerExecutor::~EagerExecutor() = default;

int64_t EagerExecutor::gradientBufferBytes() const {
  int64_t bytes = 0;
  for (const auto &[dtype, scratch] : scratch_)
    bytes += static_cast<int64_t>(scratch.nbytes());
  if (!scratch_.empty())
    return bytes;
  for (const auto &[key, state] : phases_)
    for (const at::Tensor &buffer : state.reducer->buffers())
      bytes += static_cast<int64_t>(buffer.nbytes());
  return bytes;
}

const PhaseReducer &EagerExecutor::reducer(const std::string &phase) const {
  return *phases_.at(phase).reducer;
}

void EagerExecutor::broadcastCoalesced(std::vector<at::Tensor> tensors) {
  std::map<c10::ScalarType, std::vector<at::Tensor>> byType;
  for (const at::Tensor &t : tensors)
    byType[t.scalar_type()].push_back(t);
  for (auto &[type, group] : byType) {
    at::Tensor flat = torch::utils::flatten_dense_tensors(group);
    std::vector<at::Tensor> io{flat};
    c10d::BroadcastOptions options;
    options.asyncOp = false; // waited for at once: NCCL runs it on the compute stream
    waitFor(group_->broadcast(io, options));
    auto pieces = torch::utils::unflatten_dense_tensors(flat, group);
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < group.size(); ++i)
      group[i].copy_(pieces[i]);
  }
}

void EagerExecutor::broadcastBuffers() {
  if (!buffers_.empty())
    broadcastCoalesced(buffers_);
}

void EagerExecutor::broadcastState() {
  std::vector<at::Tensor> all = buffers_;
  for (const auto &[name, p] : parameters_)
    all.push_back(p);
  broadcastCoalesced(all);
}

namespace {

/// torch.autocast(device, dtype) for the scope of one forward: the same thread-local switches,
/// nesting count and cast cache as the Python context manager, restored on exit.
class AutocastScope {
public:
  AutocastScope(c10::DeviceType device, const std::string &dtype) : device_(device) {
    if (dtype.empty())
      return;
    active_ = true;
    wasEnabled_ = at::autocast::is_autocast_enabled(device);
    previousType_ = at::autocast::get_autocast_dtype(device);
    wasCacheEnabled_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(device, true);
    at::autocast::set_autocast_dtype(device, dtype == "bf16" ? at::kBFloat16 : at::kHalf);
    at::autocast::increment_nesting();
    // The cast cache on, as torch.autocast has it: a weight used twice in one forward (D on
    // real and on fake images) is cast once, so its two low-precision gradients add up before
    // the cast back, in the order eager PyTorch adds them. The cache lives for this scope
    // only (cleared below), so under CUDA Graph capture no cached cast outlives the capture.
    at::autocast::set_autocast_cache_enabled(true);
  }
  ~AutocastScope() {
    if (!active_)
      return;
    if (at::autocast::decrement_nesting() == 0)
      at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, wasEnabled_);
    at::autocast::set_autocast_dtype(device_, previousType_);
    at::autocast::set_autocast_cache_enabled(wasCacheEnabled_);
  }
  AutocastScope(const AutocastScope &) = delete;
  AutocastScope &operator=(const AutocastScope &) = delete;

private:
  c10::DeviceType device_;
  bool active_ = false;
  bool wasEnabled_ = false;
  bool wasCacheEnabled_ = true;
  at::ScalarType previousType_ = at::kFloat;
};

} // namespace

c10::IValue EagerExecutor::forward(PhaseState &state, const std::vector<at::Tensor> &inputs) {
  AutocastScope autocast(options_.device.type(), state.plan->autocast);
  std::vector<c10::IValue> args(inputs.begin(), inputs.end());
  if (state.function) {
    args.insert(args.begin(), module_._ivalue());
    state.function->run(args);
    return args.back();
  }
  return module_.get_method(state.plan->method)(args);
}

c10::impl::GenericDict EagerExecutor::runSection(const SectionCall &call, const InputFn &inputs,
                                                 int64_t micro) {
  const std::vector<at::Tensor> values = inputs(micro);
  bool records = false;
  for (auto &[name, p] : parameters_) {
    const bool use = call.records && call.records(name);
    p.requires_grad_(use);
    records |= use;
  }
  // DDP broadcasts buffers before every forward of a wrapped module; a section is one.
  if (options_.broadcastBuffers)
    broadcastBuffers();
  std::optional<torch::NoGradGuard> noGrad;
  if (!records)
    noGrad.emplace();
  AutocastScope autocast(options_.device.type(), call.autocast);
  std::vector<c10::IValue> args(values.begin(), values.end());
  return module_.get_method(call.method)(args).toGenericDict();
}

namespace {

/// Splits a phase method's output into its loss and the values it logs, each detached and
/// divided by `accumulate` (their mean over micro-batches), added into `stats`; the entries
/// `outputs` names are handed on, detached, into `handed`.
at::Tensor splitOutput(const c10::IValue &output, int64_t accumulate,
                       const std::vector<std::string> &outputs,
                       std::vector<std::pair<std::string, at::Tensor>> &stats,
                       std::map<std::string, at::Tensor> &handed) {
  if (!output.isTuple())
    return output.toTensor();
  const auto &elements = output.toTupleRef().elements();
  torch::NoGradGuard noGrad;
  size_t i = 0;
  for (const auto &entry : elements.at(1).toGenericDict()) {
    const std::string &key = entry.key().toStringRef();
    if (std::find(outputs.begin(), outputs.end(), key) != outputs.end()) {
      handed[key] = entry.value().toTensor().detach();
      continue;
    }
    at::Tensor value =
        entry.value().toTensor().detach().to(at::kFloat) / static_cast<double>(accumulate);
    if (i < stats.size())
      stats[i].second = stats[i].second + value;
    else
      stats.emplace_back(entry.key().toStringRef(), value);
    ++i;
  }
  return elements.at(0).toTensor();
}

} // namespace

std::string EagerExecutor::mode(const std::string &phase) const {
  auto it = phases_.find(phase);
  return it != phases_.end() && it->second.joint ? "joint" : "eager";
}

namespace {

/// Adds a gradient into a parameter's .grad as autograd's AccumulateGrad does with gradient
/// mode off: the first one is taken as it is, later ones added in place.
void accumulateGrad(at::Tensor parameter, const at::Tensor &gradient) {
  at::Tensor &grad = parameter.mutable_grad();
  if (!grad.defined())
    grad = gradient;
  else
    grad.add_(gradient);
}

} // namespace

at::Tensor EagerExecutor::jointSeed(const PhaseState &state) const {
  // Autograd seeds (loss / accumulate * scale).backward() with 1 in the scaled loss's dtype:
  // multiplied by the scale there and cast to the loss's dtype (MulBackward, then the cast to
  // its input's dtype), then divided by the micro-batches in the loss's dtype. Under float16
  // autocast the loss is float16: a scale past its range is inf there, as in eager.
  const at::TensorOptions on = at::TensorOptions(options_.device);
  at::Tensor seed;
  auto scale = options_.lossScales.find(state.plan->name);
  if (scale != options_.lossScales.end())
    seed = (at::ones({}, on.dtype(scale->second.scalar_type())) * scale->second).to(state.lossType);
  else
    seed = at::ones({}, on.dtype(state.lossType));
  if (state.plan->accumulate > 1)
    seed = seed / static_cast<double>(state.plan->accumulate);
  return seed.to(state.seedType);
}

at::Tensor EagerExecutor::jointForwardBackward(PhaseState &state,
                                               const std::vector<at::Tensor> &inputs,
                                               int64_t micro) {
  const int64_t accumulate = state.plan->accumulate;
  const bool last = micro + 1 == accumulate;
  if (micro == 0) {
    state.reducer->prepare(parameters_);
    if (options_.broadcastBuffers)
      broadcastBuffers();
  }
  const JointGraph &graph = state.joint->graph();
  std::map<std::string, at::Tensor> &given = state.jointInputs;
  size_t next = 0;
  for (const JointPort &port : graph.inputs) {
    if (port.kind == "input") {
      if (next >= inputs.size())
        throw std::runtime_error("phase '" + state.plan->key() + "': its joint graph takes more " +
                                 "inputs than the phase is given");
      given[port.name] = inputs[next++];
    } else if (port.kind == "seed") {
      given[port.name] = jointSeed(state);
    }
  }
  auto start = std::chrono::steady_clock::now();
  auto outputs = state.joint->run(given, [&](const std::string &name, const at::Tensor &g) {
    at::Tensor p = parameters_.at(name);
    accumulateGrad(p, g);
    if (last)
      state.reducer->markReady(name, p);
  });
  if (!outputs)
    throw std::runtime_error(outputs.status().message());
  if (state.timeline && last)
    state.timeline->mark(RunTimeline::BackwardEnd);
  if (last)
    state.reducer->finish(parameters_);
  lastWorkSeconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  lastOutputs_.emplace_back();
  size_t stat = 0;
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
    if (graph.outputs[i].kind != "stat")
      continue;
    at::Tensor value =
        (*outputs)[i].toTensor().detach().to(at::kFloat) / static_cast<double>(accumulate);
    if (stat < lastStats_.size())
      lastStats_[stat].second = lastStats_[stat].second + value;
    else
      lastStats_.emplace_back(graph.outputs[i].name, value);
    ++stat;
  }
  at::Tensor loss = (*outputs)[0].toTensor();
  if (accumulate > 1)
    loss = loss / static_cast<double>(accumulate); // the mean over micro-batches
  return loss.detach();
}

at::Tensor EagerExecutor::forwardBackward(const std::string &phase,
                                          const std::vector<at::Tensor> &inputs, int64_t micro) {
  auto it = phases_.find(phase);
  if (it == phases_.end())
    throw std::runtime_error("no phase '" + phase + "' in the plan");
  PhaseState &state = it->second;
  if (state.joint)
    return jointForwardBackward(state, inputs, micro);
  const int64_t accumulate = state.plan->accumulate;
  // Micro-batches before the last accumulate into .grad locally, like DDP under no_sync();
  // the last one's hooks write the sums into the buckets and launch the all-reduces.
  const bool last = micro + 1 == accumulate;
  if (micro == 0) {
    for (auto &[tensor, wanted] : state.requiresGrad)
      tensor.requires_grad_(wanted);
    state.reducer->prepare(parameters_);
    // DDP broadcasts buffers before a forward only if the previous one synchronised: with
    // no_sync() on the first micro-batches, that is before the first micro-batch only.
    if (options_.broadcastBuffers)
      broadcastBuffers();
  }
  hooks_->clearUnexpected();
  hooks_->setActive(last ? state.reducer.get() : nullptr);
  at::Tensor loss;
  auto start = std::chrono::steady_clock::now();
  RunTimeline *timeline = last ? state.timeline.get() : nullptr;
  try {
    lastOutputs_.emplace_back();
    loss = splitOutput(forward(state, inputs), accumulate, state.plan->outputs, lastStats_,
                       lastOutputs_.back());
    if (accumulate > 1)
      loss = loss / static_cast<double>(accumulate); // the mean over micro-batches
    auto scale = options_.lossScales.find(state.plan->name);
    if (scale != options_.lossScales.end())
      (loss * scale->second).backward(); // GradScaler.scale(loss)
    else
      loss.backward();
  } catch (...) {
    hooks_->setActive(nullptr);
    throw;
  }
  if (timeline)
    timeline->mark(RunTimeline::BackwardEnd);
  hooks_->setActive(nullptr);
  if (last)
    state.reducer->finish(parameters_);
  lastWorkSeconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!hooks_->unexpected().empty())
    throw std::runtime_error("phase '" + phase + "': parameter '" + hooks_->unexpected()[0] +
                             "' received a gradient that the plan says it never gets; the "
                             "plan does not describe this model's phase");
  return loss.detach();
}

at::Tensor EagerExecutor::run(const std::string &phase, const InputFn &inputs, const StepFn &step) {
  auto it = phases_.find(phase);
  if (it == phases_.end())
    throw std::runtime_error("no phase '" + phase + "' in the plan");
  lastWorkSeconds_ = 0;
  lastStats_.clear();
  lastOutputs_.clear();
  lastRun_ = RunStats();
  RunTimeline *timeline = it->second.timeline.get();
  if (timeline)
    timeline->mark(RunTimeline::Start);
  at::Tensor loss;
  for (int64_t micro = 0; micro < it->second.plan->accumulate; ++micro) {
    at::Tensor part = forwardBackward(phase, inputs(micro), micro);
    loss = micro == 0 ? part : loss + part;
  }
  if (timeline)
    timeline->mark(RunTimeline::StepStart);
  if (step)
    step(phase, *it->second.reducer);
  if (timeline) {
    timeline->mark(RunTimeline::StepEnd);
    if (!options_.device.is_cuda())
      lastRun_ = timedRun(phase);
  }
  return loss;
}

RunStats EagerExecutor::timedRun(const std::string &phase) const {
  RunTimeline &timeline = *phases_.at(phase).timeline;
  const std::vector<double> seconds = timeline.read();
  RunStats run;
  run.profiled = true;
  run.backwardSeconds = seconds[RunTimeline::BackwardEnd];
  run.reducedSeconds = seconds[RunTimeline::StepStart];
  for (size_t b = 0; b < timeline.buckets(); ++b)
    run.bucketReadySeconds.push_back(seconds[timeline.bucket(b)]);
  for (size_t i = 0; i < timeline.parameters(); ++i)
    run.parameterReadySeconds.push_back(seconds[timeline.parameter(i)]);
  run.stepSeconds = seconds[RunTimeline::StepEnd] - seconds[RunTimeline::StepStart];
  return run;
}

} // namespace ganc::backend
