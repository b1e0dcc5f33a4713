// One rank's set-up: plan, archive, identity check, device, process group, executor.
#include "runtime/Setup.h"

#include "backend/Device.h"
#include "backend/JointProgram.h"
#include "frontend/DoubleBackward.h"
#include "frontend/SpecSchema.h"
#include "ir/Plan.h"
#include "ir/Recipe.h"
#include "ops/Ops.h"
#include "passes/Pass.h"
#include "support/Files.h"
#include "support/TextFormat.h"
#include "support/torch/Collectives.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

namespace ganc::runtime {

namespace fs = std::filesystem;

namespace {

void setThreads(const Session &s) {
  int threads = s.options.threads;
  if (threads <= 0) {
    int local = s.rank.worldSize;
    if (const char *l = std::getenv("LOCAL_WORLD_SIZE"))
      local = std::max(1, std::atoi(l));
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local);
  }
  torch::set_num_threads(threads);
}

Status joinGroup(Session &s, Expected<ProcessGroup> group) {
  if (!group)
    return group.status();
  s.group = *group;
  return Status::ok();
}

/// CPU ranks use Gloo; GPU ranks NCCL, one GPU each (cuda:LOCAL_RANK), or Gloo where asked,
/// ranks then sharing GPUs (cuda:LOCAL_RANK % GPUs); the model moved there (and to its
/// layout) before the executor binds its parameters.
Status setUpDevice(Session &s) {
  const TrainOptions &o = s.options;
  std::chrono::seconds timeout(o.timeoutSeconds);
  if (o.device == "cpu") {
    s.device = c10::kCPU;
    if (o.memoryFormat == MemoryFormat::ChannelsLast)
      s.channelsLast = backend::toChannelsLast(s.module());
    return joinGroup(s, createGlooGroup(s.rank, timeout));
  }
  if (o.device != "cuda")
    return Status::error("--device takes cpu or cuda, not '" + o.device + "'");
  if (!backend::cudaAvailable())
    return Status::error("--device cuda: no GPU is visible to this process (or this ganc was "
                         "built without the CUDA backend)");
  const int gpus = static_cast<int>(torch::cuda::device_count());
  const bool gloo = o.distBackend == DistBackend::Gloo;
  if (!gloo && s.rank.localRank >= gpus)
    return Status::error("--device cuda: LOCAL_RANK " + std::to_string(s.rank.localRank) +
                         " has no GPU (" + std::to_string(gpus) +
                         " visible; NCCL needs one per rank, --dist-backend gloo shares them)");
  s.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(s.rank.localRank % gpus));
  c10::impl::VirtualGuardImpl(c10::kCUDA).setDevice(s.device);
  // cuBLAS is deterministic on one stream only with a fixed workspace; it reads this before
  // its first handle is made, so it is set before anything runs on the GPU.
  if (o.deterministic)
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicCuDNN(o.deterministic);
  at::globalContext().setBenchmarkCuDNN(o.cudnnBenchmark && !o.deterministic);
  if (o.deterministic)
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  s.module().to(s.device);
  if (o.memoryFormat != MemoryFormat::Contiguous)
    s.channelsLast = backend::toChannelsLast(s.module());
  return joinGroup(s, gloo ? createGlooGroup(s.rank, timeout) : createNcclGroup(s.rank, timeout));
}

/// The plan's shards for this run: the stage is the plan's or --zero's; the layout is planned
/// for this world size when the plan's is for another (or none). One rank has nothing to
/// shard: a warning, and the run is unsharded.
Status planShards(Session &s) {
  ir::Module &plan = *s.plan;
  const int stage = s.options.zero >= 0 ? s.options.zero : plan.zeroStage;
  const int64_t world = s.rank.worldSize;
  if (stage > 0 && world == 1 && s.isRankZero())
    std::cerr << "ganc: warning: zero " << stage
              << " with one rank: there is nothing to shard; training unsharded" << std::endl;
  const int64_t ranks = stage > 0 && world > 1 ? world : 0;
  if (stage == plan.zeroStage && ranks == plan.shardRanks)
    return Status::ok();
  if (ranks && plan.shardRanks && s.isRankZero())
    std::cout << "the plan's shards are laid out for " << plan.shardRanks
              << " ranks; planning them for " << world << std::endl;
  passes::PassOptions options;
  options.zeroStage = stage;
  options.ranks = ranks;
  auto changed = passes::runSharding(plan, options);
  if (!changed)
    return changed.status().withContext(s.options.plan);
  // The joint graphs' collectives follow the stage: ZeRO 2 reduce-scatters what they reduced.
  changed = passes::runJointSchedule(plan, options);
  if (!changed)
    return changed.status().withContext(s.options.plan);
  return ir::verifyInvariants(plan).withContext("sharding " + s.options.plan);
}

/// Each phase of the plan runs the archive's method its graph was lowered from (its spec's),
/// which takes as many inputs as the phase has: a plan edited to call another method is bad
/// input here, not an error at step 0 or a run that trains another phase's code.
Status checkPhaseMethods(const ir::Module &plan, const frontend::Archive &archive) {
  for (const auto &phase : plan.phases) {
    const frontend::PhaseSpec *spec = nullptr;
    for (const frontend::PhaseSpec &p : archive.spec.phases)
      if (p.name == phase->name)
        spec = &p;
    const std::string where = "phase '" + phase->name + "': ";
    if (spec && spec->method != phase->method)
      return Status::error(where + "the plan calls method '" + phase->method +
                           "', and its graph was lowered from '" + spec->method +
                           "' (the spec's); the plan was edited: run ganc compile again");
    if (!archive.torchscript) // ganc's own archive: each phase is its joint graph
      continue;
    auto method = archive.module.find_method(phase->method);
    if (!method)
      return Status::error(where + "the archive has no method '" + phase->method + "'");
    // A phase that runs through sections has their inputs in place of the values it takes.
    size_t arguments = method->function().getSchema().arguments().size() - 1; // self
    for (const frontend::InputSpec &in : spec ? spec->inputs : std::vector<frontend::InputSpec>())
      arguments -= in.source == frontend::InputSource::Output && !in.detach ? 1 : 0;
    for (const std::string &name : phase->through)
      if (const frontend::PhaseSpec *section = archive.spec.findPhase(name))
        arguments += section->inputs.size();
    if (arguments != phase->inputs.size())
      return Status::error(where + "method '" + phase->method + "' takes " +
                           std::to_string(arguments) + " inputs, the phase has " +
                           std::to_string(phase->inputs.size()));
  }
  for (const frontend::PhaseSpec &section : archive.spec.phases)
    if (archive.torchscript && section.isSection() && !archive.module.find_method(section.method))
      return Status::error("section '" + section.name + "': the archive has no method '" +
                           section.method + "'");
  return Status::ok();
}

/// Whether the plan fuses anything in any phase.
bool fusesAny(const ir::Module &plan) {
  return std::any_of(plan.phases.begin(), plan.phases.end(), [](const auto &phase) {
    return phase->fusedResamplings + phase->fusedBiasActs > 0;
  });
}

/// The start-up line of a phase whose graph ganc rewrote: what it fused, how many grouped
/// convolutions take ganc's double backward.
void tellRewrites(const std::string &phase, const frontend::FusionReport *fusion, size_t rewritten,
                  DoubleBackward mode) {
  std::cout << "phase '" << phase << "':";
  if (fusion)
    std::cout << " fused " << fusion->resamplings << " resampling(s) as ganc::upfirdn2d and "
              << fusion->biasActs << " bias + activation(s) as ganc::bias_act (--fusion on)"
              << (rewritten ? ";" : "");
  if (rewritten)
    std::cout << " " << rewritten << " grouped convolution" << (rewritten == 1 ? "" : "s")
              << " run as ganc::convolution, for its double backward (--double-backward "
              << nameOf(mode, doubleBackwardNames()) << ")";
  std::cout << std::endl;
}

/// --executor joint: each phase runs the joint graph its archive keeps (ganc.export(...,
/// joint=True)) through ganc's executor; its gradients must be the plan's used parameters.
/// Where the plan's joint graph of `phase` reduces each bucket: after the op before its
/// collective, the bucket's gradients.
std::vector<backend::JointProgram::Launch> launchesOf(const ir::Phase &phase) {
  std::vector<backend::JointProgram::Launch> launches;
  std::string after;
  for (const auto &op : phase.joint.ops) {
    const ir::Attribute *bucket = op->attribute("bucket");
    if (op->name != ir::joint::kAllReduce && op->name != ir::joint::kReduceScatter) {
      if (!op->results.empty())
        after = op->results[0]->name;
    } else if (bucket && std::holds_alternative<int64_t>(*bucket)) {
      backend::JointProgram::Launch launch{after, {}};
      for (const ir::Bucket::Slot &slot :
           phase.buckets.at(static_cast<size_t>(std::get<int64_t>(*bucket))).slots)
        launch.parameters.push_back(slot.parameter);
      launches.push_back(std::move(launch));
    }
  }
  return launches;
}

/// The plan's joint graph of `phase` is the archive's: the same nodes in the same order (the
/// plan places its collectives by the names of the values they follow).
Status sameJointGraph(const ir::Phase &phase, const JointGraph &graph) {
  std::vector<std::pair<std::string, std::string>> planned;
  for (const auto &op : phase.joint.ops)
    if (ir::joint::isNode(op->name) && !op->results.empty())
      planned.emplace_back(op->results[0]->name, op->name);
  for (size_t i = 0; i < std::max(planned.size(), graph.nodes.size()); ++i) {
    const std::string kept = i < graph.nodes.size()
                                 ? graph.nodes[i].value("out", std::string()) + " (" +
                                       graph.nodes[i].value("op", std::string()) + ")"
                                 : "nothing";
    const std::string op = i < planned.size() && planned[i].second == ir::joint::kItem
                               ? std::string("getitem")
                           : i < planned.size() ? planned[i].second
                                                : std::string();
    const std::string plans = i < planned.size() ? planned[i].first + " (" + op + ")" : "nothing";
    if (kept != plans)
      return Status::error("the plan's joint graph is not the archive's: its node " +
                           std::to_string(i + 1) + " is " + plans + " where the archive has " +
                           kept + "; compile the plan again from this archive");
  }
  return Status::ok();
}

/// What of this run differs from what `graph` was captured for: the phase's autocast
/// precision (--precision, ganc.train(precision=...)) and the batch (--batch-size); "" where
/// nothing does (or the op list does not say).
std::string capturedForAnother(const Session &s, const ir::Phase &phase, const JointGraph &graph) {
  if (!graph.precision.empty() && ir::autocastOf(graph.precision) != phase.autocast)
    return "its joint graph was captured under " + graph.precision +
           " autocast, and this run's is " +
           (phase.autocast.empty() ? std::string("float32") : ir::precisionOf(phase.autocast));
  if (graph.batch > 0 && graph.batch != s.spec().batchSize)
    return "its joint graph was captured for a batch of " + std::to_string(graph.batch) +
           ", and this run's is " + std::to_string(s.spec().batchSize);
  return "";
}

Status addJointPrograms(const Session &s, backend::ExecutorOptions &options) {
  if (s.options.executor == PhaseExecutor::Joint && s.device.is_cuda())
    return Status::error("--executor joint runs on the CPU for now; on " + s.device.str() +
                         " give --executor torchscript");
  if (!s.archive->torchscript && s.device.is_cuda())
    return Status::error(s.options.model +
                         " was exported without TorchScript (its joint graphs are its code), "
                         "which ganc runs on the CPU for now; on " +
                         s.device.str() + " export it with TorchScript (ganc.export's default)");
  if (!s.archive->torchscript && s.options.executor == PhaseExecutor::TorchScript)
    return Status::error("--executor torchscript: " + s.options.model +
                         " was exported without TorchScript; its joint graphs are its code");
  for (const auto &phase : s.plan->phases) {
    if (!s.options.runsJoint(*phase, s.device.is_cuda()))
      continue;
    const std::string where = "--executor " + nameOf(s.options.executor, phaseExecutorNames()) +
                              ": phase '" + phase->key() + "'";
    auto graph = s.archive->jointGraphs.find(phase->key());
    if (graph == s.archive->jointGraphs.end())
      return Status::error(where + ": " + s.options.model +
                           " keeps no joint graph for it; export it with ganc.export(..., "
                           "joint=True)");
    if (phase->joint.ops.empty())
      return Status::error(where + ": " + s.options.plan +
                           " holds no joint graph for it; compile it again from " +
                           s.options.model);
    GANC_TRY(sameJointGraph(*phase, graph->second).withContext(where));
    const std::string differs = capturedForAnother(s, *phase, graph->second);
    if (!differs.empty()) {
      if (s.options.executor == PhaseExecutor::Joint || phase->onlyJoint())
        return Status::error(where + ": " + differs + "; export it again for this run" +
                             (phase->onlyJoint() ? "" : ", or give --executor torchscript"));
      // auto: TorchScript runs it, and the plan this run trains (and keeps) has no graph.
      if (s.isRankZero())
        std::cout << "phase '" << phase->key() << "': TorchScript and autograd: " << differs
                  << std::endl;
      phase->joint.ops.clear();
      continue;
    }
    auto program = backend::JointProgram::compile(graph->second, launchesOf(*phase));
    if (!program)
      return program.status().withContext(s.options.model);
    if (phase->doubleBackward == "filters" && phase->jointGroupedConvolutions > 0 && s.isRankZero())
      std::cout << "phase '" << phase->key() << "': " << phase->jointGroupedConvolutions
                << " grouped convolution" << (phase->jointGroupedConvolutions == 1 ? "" : "s")
                << " run as ganc::convolution, for its double backward (--double-backward "
                   "filters; captured so in its joint graph)"
                << std::endl;
    options.jointPrograms[phase->key()] = program.take();
  }
  return Status::ok();
}

Status createExecutor(Session &s) {
  const frontend::Spec &spec = s.spec();
  backend::ExecutorOptions options;
  options.device = s.device;
  options.broadcastBuffers = spec.buffers == "broadcast";
  options.useGraphs = s.options.cudaGraphs;
  options.stepGraphs = s.options.launchesSteps();
  // Only sharded gradients need keeping: unsharded ones stay in their buckets until read.
  options.keepGradients = !s.options.dumpDir.empty() && s.plan->zeroStage > 0;
  options.warmupIterations = s.options.warmup;
  options.memsetsAsKernels = s.options.memsetNodes == GraphNodes::Kernel;
  options.copiesAsKernels = s.options.copyNodes == GraphNodes::Kernel;
  options.collectivesOnComputeStream =
      s.options.commStream == CommStream::Compute ||
      (s.options.commStream == CommStream::Auto && s.rank.worldSize == 1);
  options.profile = !s.options.profile.empty();
  for (const auto &phase : s.plan->phases)
    if (!phase->lossScaler.empty())
      options.lossScales[phase->name] = s.lossScalers.at(phase->lossScaler).scale();
  // The graphs phases run instead of their method: every stage's phases specialised now
  // (switching stage later only picks them); phases with synchronised batch norm, as they
  // were compiled; phases the plan fuses, fused (--fusion); phases the plan gives ganc's
  // double backward, their grouped convolutions as ganc::convolution (--double-backward).
  std::set<std::string> told;
  for (size_t stage = 0; stage < (spec.stages ? spec.stages->list.size() : 1); ++stage)
    for (const frontend::PhaseSpec &phase : spec.phases) {
      const std::string key =
          spec.stages ? ir::phaseKey(phase.name, spec.stages->list[stage].name) : phase.name;
      const ir::Phase *compiled = s.plan->findPhase(key);
      if (compiled && s.options.runsJoint(*compiled, s.device.is_cuda()))
        continue; // its joint graph, not its method's graph, is what runs
      const bool plain = phase.isSection() || !phase.throughSections().empty();
      const bool fuses =
          !plain && compiled && compiled->fusedResamplings + compiled->fusedBiasActs > 0;
      const bool ownDoubleBackward = compiled && (compiled->doubleBackward == "filters" ||
                                                  compiled->doubleBackward == "grouped");
      const bool needed = spec.stages || !spec.syncBatchNorm.empty();
      if (!needed && !fuses && !ownDoubleBackward)
        continue;
      frontend::FusionReport fusion;
      auto graph = frontend::phaseGraph(
          *s.archive, phase, spec.stages ? static_cast<int>(stage) : -1, fuses ? &fusion : nullptr);
      if (!graph)
        return graph.status();
      if (fuses && (fusion.resamplings != compiled->fusedResamplings ||
                    fusion.biasActs != compiled->fusedBiasActs))
        return Status::error("phase '" + key + "': the plan fuses " +
                             std::to_string(compiled->fusedResamplings) + " resamplings and " +
                             std::to_string(compiled->fusedBiasActs) +
                             " bias + activations, the archive's graph " +
                             std::to_string(fusion.resamplings) + " and " +
                             std::to_string(fusion.biasActs) +
                             ": compile the plan again from this archive")
            .inFile(s.options.plan);
      size_t rewritten = 0;
      if (ownDoubleBackward)
        rewritten =
            frontend::rewriteGroupedConvolutions(**graph, compiled->doubleBackward == "grouped");
      if ((rewritten || fuses) && s.isRankZero() && told.insert(phase.name).second)
        tellRewrites(phase.name, fuses ? &fusion : nullptr, rewritten, s.options.doubleBackward);
      if (needed || rewritten || fuses)
        options.phaseGraphs[key] = graph.take();
    }
  GANC_TRY(addJointPrograms(s, options));
  if (s.archive->sampleGraph) {
    auto sampler = backend::JointProgram::compile(*s.archive->sampleGraph);
    if (!sampler)
      return sampler.status().withContext(s.options.model + ": the sample grid's graph");
    s.sampler = sampler.take();
  }
  ops::setSyncBatchNormGroup(s.group.backend);
  auto executor = backend::createExecutor(*s.plan, s.module(), s.group.backend, options);
  if (!executor)
    return executor.status().withContext(s.options.plan);
  s.executor = executor.take();
  return Status::ok();
}

} // namespace

namespace {

/// --profile FILE is written when training ends: refuse at start a path that cannot be
/// written (a directory, a parent that cannot be made) instead of after the run.
Status checkProfilePath(const std::string &path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return Status::error("--profile " + path + " is a directory; give a file name");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec) && !fs::create_directories(parent, ec))
    return Status::error("--profile " + path + ": cannot make its directory (" + ec.message() +
                         ")");
  return Status::ok();
}

/// --kimg, --tick-kimg and --snap in steps of this run (each step trains stepImages()).
Status resolveRunLength(Session &s, const TrainOptions &options) {
  if (options.kimg > 0) {
    if (options.stepsGiven)
      return Status::error("--kimg and --steps both give the run's length: give one");
    const auto images = static_cast<double>(s.stepImages());
    s.options.steps = static_cast<int64_t>(std::ceil(options.kimg * 1000.0 / images));
  }
  if (options.snap > 0 && options.tickKimg <= 0)
    return Status::error("--snap counts ticks: give --tick-kimg too");
  for (const std::string &flag : options.intervalsGiven) {
    const bool progress = flag == "--log-every";
    if (progress ? options.tickKimg > 0 : options.snap > 0)
      return Status::error(
          std::string(progress ? "--tick-kimg" : "--snap") + " and " + flag + " both give the " +
          (progress ? "progress interval" : "sample and checkpoint intervals") + ": give one");
  }
  if (options.tickKimg > 0) {
    const auto tick = static_cast<int64_t>(
        std::ceil(options.tickKimg * 1000.0 / static_cast<double>(s.stepImages())));
    s.options.logEvery = tick;
    int64_t every = 0;
    if (options.snap > 0 && __builtin_mul_overflow(tick, options.snap, &every))
      return Status::error("--snap " + std::to_string(options.snap) + " ticks of --tick-kimg " +
                           formatDouble(options.tickKimg) + " (" + std::to_string(tick) +
                           " steps each) is past any run's length; give a smaller --snap");
    if (options.snap > 0)
      s.options.sampleEvery = s.options.checkpointEvery = every;
  }
  return Status::ok();
}

} // namespace

Expected<std::unique_ptr<Session>> setUp(const TrainOptions &options) {
  auto s = std::make_unique<Session>();
  s->options = options;
  auto rank = rankFromEnvironment();
  if (!rank)
    return rank.status();
  s->rank = *rank;
  setThreads(*s);
  if (s->isRankZero() && !options.profile.empty())
    GANC_TRY(checkProfilePath(options.profile));

  auto plan = ir::readPlan(options.plan);
  if (!plan)
    return plan.status();
  s->plan = plan.take();
  GANC_TRY(frontend::loadOpLibraries(options.opLibraries));
  // The plan's spec, bound to the archive's code (an older plan without one: the archive's).
  auto archive = frontend::loadArchive(options.model, s->plan->spec);
  if (!archive)
    return archive.status();
  s->archive = std::make_unique<frontend::Archive>(archive.take());
  GANC_TRY(checkPhaseMethods(*s->plan, *s->archive));
  const bool planFuses = fusesAny(*s->plan);
  GANC_TRY(applyOverrides(s->archive->spec, *s->plan, options));
  if (planFuses && options.fusion == Fusion::Auto && !options.fuses() && s->isRankZero())
    std::cout << "fusion: off on the CPU (--fusion auto): the resamplings and bias + activations "
                 "run as the model wrote them, bit for bit as eager; --fusion on runs ganc's ops"
              << std::endl;
  // The plan's spec as it trains (--lr, --batch-size ...): the plan a run directory keeps is
  // the whole of what it trained.
  s->plan->spec = frontend::planSpecText(effectiveSpec(s->archive->spec, *s->plan).dump());
  if (s->archive->identity != s->plan->identity)
    return Status::error(options.plan + " was compiled from another model (identity " +
                         s->plan->identity + "), not " + options.model + " (identity " +
                         s->archive->identity + "); run ganc compile " + options.model + " again");
  GANC_TRY(resolveRunLength(*s, options));
  s->inputType = frontend::inputScalarType(s->spec());
  GANC_TRY(setUpDevice(*s));
  GANC_TRY(planShards(*s));
  for (const ir::LossScaler &l : s->plan->lossScalers)
    s->lossScalers.emplace(l.name, LossScaler(l, s->device));
  for (const auto &[name, c] : s->spec().controllers)
    s->controllers.emplace(name, Controller(c, s->device, s->inputType));
  GANC_TRY(createExecutor(*s));
  s->executor->broadcastState();

  if (s->options.nonFinite.empty())
    s->options.nonFinite = s->spec().nonFinite;
  for (const frontend::PhaseSpec &phase : s->spec().phases) {
    s->skippedSteps[phase.name] =
        torch::zeros({}, at::TensorOptions(s->device).dtype(torch::kLong));
    s->gradNorms[phase.name] = torch::zeros({}, at::TensorOptions(s->device).dtype(at::kFloat));
  }
  for (const auto &[sub, optSpec] : s->spec().optimizers)
    s->optimizers.emplace(sub, Optimizer(optSpec, s->device));
  for (const auto &phase : s->plan->phases)
    for (const std::string &name : phase->used)
      s->groupOf[name] = s->plan->findParameter(name)->group;
  for (size_t i = 0; i < s->plan->parameters.size(); ++i)
    s->parameterIndex[s->plan->parameters[i].name] = i;

  if (s->isRankZero() && !options.dumpDir.empty()) {
    std::error_code ec;
    fs::create_directories(options.dumpDir, ec);
  }
  return s;
}

Status setUpWithInputs(const TrainOptions &options, std::unique_ptr<Session> &session,
                       std::unique_ptr<PhaseInputs> &inputs) {
  auto s = setUp(options);
  if (!s)
    return s.status();
  session = s.take();
  auto in = PhaseInputs::create(*session);
  if (!in)
    return in.status();
  inputs = in.take();
  return Status::ok();
}

} // namespace ganc::runtime
