// Checkpoint writing and resuming.
#include "runtime/rundir/Checkpoint.h"

#include "backend/Reducer.h"
#include "runtime/rundir/Dict.h"
#include "runtime/rundir/RunDir.h"
#include "support/Files.h"
#include "support/Hash.h"
#include "support/TextFormat.h"
#include "support/torch/Collectives.h"
#include "support/torch/TorchError.h"

#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include <cmath>
#include <iostream>

namespace ganc::runtime {

namespace {

/// "generator.main.0.weight" -> ("generator", "main.0.weight"); unowned names go to "model".
std::pair<std::string, std::string> splitOwner(const std::string &name) {
  size_t dot = name.find('.');
  if (dot == std::string::npos)
    return {"model", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

/// Every rank's `mine` (the same size on every rank), gathered to every rank, on the CPU.
/// NCCL gathers device tensors only: what is gathered travels through the device.
std::vector<at::Tensor> allGatherToCpu(Session &s, const at::Tensor &mine) {
  std::vector<std::vector<at::Tensor>> gathered(1);
  for (int r = 0; r < s.rank.worldSize; ++r)
    gathered[0].push_back(torch::empty_like(mine));
  std::vector<at::Tensor> input{mine};
  waitFor(s.group.backend->allgather(gathered, input));
  for (at::Tensor &t : gathered[0])
    t = t.cpu();
  return gathered[0];
}

/// Every rank's state of `generator`, gathered to every rank (on the CPU).
std::vector<at::Tensor> gatherStates(Session &s, at::Generator &generator) {
  return allGatherToCpu(s, generator.get_state().to(s.device));
}

/// With `buffers: local` each rank's buffers are its own (batch norm statistics, a running
/// mean a loss reads, spectral norm's power-iteration vectors), and a rank's next steps depend
/// on them: every rank's buffers by full name, gathered as bytes in one all-gather. Empty where
/// every rank holds rank 0's (one rank, or `buffers: broadcast`).
c10::List<c10::Dict<std::string, at::Tensor>> gatherLocalBuffers(Session &s) {
  c10::List<c10::Dict<std::string, at::Tensor>> perRank;
  if (s.rank.worldSize == 1 || s.spec().buffers != "local")
    return perRank;
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  std::vector<at::Tensor> bytes;
  for (const auto &b : s.module().named_buffers(true)) {
    buffers.emplace_back(b.name, b.value.detach());
    bytes.push_back(b.value.detach().contiguous().view(-1).view(at::kByte));
  }
  std::vector<at::Tensor> gathered;
  if (!buffers.empty())
    gathered = allGatherToCpu(s, torch::cat(bytes));
  for (int r = 0; r < s.rank.worldSize; ++r) {
    c10::Dict<std::string, at::Tensor> rank;
    int64_t offset = 0;
    for (const auto &[name, b] : buffers) {
      const int64_t size = b.numel() * static_cast<int64_t>(b.element_size());
      // A copy of its own first: a view as a wider dtype needs an aligned offset.
      rank.insert(name, gathered[static_cast<size_t>(r)]
                            .narrow(0, offset, size)
                            .clone()
                            .view(b.scalar_type())
                            .view(b.sizes()));
      offset += size;
    }
    perRank.push_back(rank);
  }
  return perRank;
}

/// A sharded optimizer's state as an unsharded run keeps it: every rank's pieces of each
/// moment gathered to rank 0 and put back together in each parameter's shape and memory
/// order (one gather per kind of state and dtype). Rank 0 gets the whole state; the others an
/// empty dict. Every rank calls it.
c10::impl::GenericDict gatherOptimizerState(Session &s, const Optimizer &optimizer) {
  torch::NoGradGuard noGrad;
  c10::impl::GenericDict local = optimizer.stateDict();
  c10::impl::GenericDict perParam = local.at("state").toGenericDict();
  const int world = s.rank.worldSize;
  const auto &parameters = s.executor->parameters();
  // (kind, dtype) -> names in key order; all ranks hold state for the same names.
  std::map<std::pair<std::string, c10::ScalarType>, std::vector<std::string>> batches;
  for (const auto &item : perParam)
    for (const auto &kind : item.value().toGenericDict())
      if (kind.key().toStringRef() != "step")
        batches[{kind.key().toStringRef(), kind.value().toTensor().scalar_type()}].push_back(
            item.key().toStringRef());
  std::map<std::string, c10::impl::GenericDict> whole;
  for (const auto &[key, names] : batches) {
    const auto &[kind, dtype] = key;
    // Rank q's pieces of every name, back to back; rank 0's are the longest.
    int64_t longest = 0;
    std::vector<at::Tensor> mine;
    for (const std::string &name : names) {
      longest += ir::pieceOf(parameters.at(name).numel(), world, 0).length;
      mine.push_back(perParam.at(name).toGenericDict().at(kind).toTensor().reshape({-1}));
    }
    const auto options = at::TensorOptions(s.device).dtype(dtype);
    const at::Tensor pieces = torch::cat(mine);
    at::Tensor input = torch::zeros({longest}, options);
    input.narrow(0, 0, pieces.numel()).copy_(pieces);
    // The root receives one tensor per rank; the others pass no outputs.
    std::vector<std::vector<at::Tensor>> outputs;
    if (s.isRankZero()) {
      outputs.emplace_back();
      for (int q = 0; q < world; ++q)
        outputs[0].push_back(torch::empty({longest}, options));
    }
    std::vector<at::Tensor> inputs{input};
    c10d::GatherOptions gather;
    gather.rootRank = 0;
    waitFor(s.group.backend->gather(outputs, inputs, gather));
    if (!s.isRankZero())
      continue;
    std::vector<int64_t> offset(world, 0);
    for (const std::string &name : names) {
      const at::Tensor &p = parameters.at(name);
      at::Tensor full = at::empty_strided(p.sizes(), p.strides(), options.device(c10::kCPU));
      const at::Tensor flat = backend::flatView(full);
      for (int q = 0; q < world; ++q) {
        const ir::Piece piece = ir::pieceOf(p.numel(), world, q);
        flat.narrow(0, piece.begin, piece.length)
            .copy_(outputs[0][q].narrow(0, offset[q], piece.length));
        offset[q] += piece.length;
      }
      if (!whole.count(name))
        whole.emplace(name, makeDict());
      whole.at(name).insert(kind, full);
    }
  }
  if (!s.isRankZero())
    return makeDict();
  for (auto &[name, entry] : whole)
    entry.insert("step", perParam.at(name).toGenericDict().at("step"));
  c10::impl::GenericDict state = makeDict();
  for (const auto &item : perParam) {
    const std::string &name = item.key().toStringRef();
    state.insert(name, whole.count(name) ? whole.at(name) : item.value().toGenericDict());
  }
  local.insert_or_assign("state", state);
  return local;
}

} // namespace

namespace {

/// A checkpoint is never written from weights that are not finite: the last good one stays.
/// One device reduction per parameter, one host read for all of them.
Status checkWeightsFinite(Session &s, int64_t step) {
  std::vector<std::string> names;
  std::vector<at::Tensor> finite;
  for (const auto &p : s.module().named_parameters(true)) {
    names.push_back(p.name);
    finite.push_back(p.value.isfinite().all());
  }
  if (finite.empty())
    return Status::ok();
  at::Tensor flags = torch::stack(finite).cpu();
  for (size_t i = 0; i < names.size(); ++i)
    if (!flags[static_cast<int64_t>(i)].item<bool>())
      return Status::failure("step " + std::to_string(step) + ": parameter '" + names[i] +
                             "' is not finite; checkpoint.pt was not written (the last one "
                             "is left as it was)");
  return Status::ok();
}

/// A checkpoint's bytes for `step` steps done (rank 0; empty elsewhere). Every rank takes part.
Expected<std::vector<char>> checkpointBytes(Session &s, PhaseInputs &inputs, int64_t step) {
  std::vector<at::Tensor> noise = gatherStates(s, inputs.noise());
  // On CUDA phase methods draw from the noise generator itself.
  std::vector<at::Tensor> phase =
      s.device.is_cuda() ? std::vector<at::Tensor>() : gatherStates(s, inputs.phaseRandom());
  c10::List<c10::Dict<std::string, at::Tensor>> localBuffers = gatherLocalBuffers(s);
  // Sharded optimizer state is saved whole, as an unsharded run saves it: a checkpoint
  // resumes on any number of ranks, sharded or not.
  c10::impl::GenericDict optimizers = makeDict();
  for (const auto &[sub, opt] : s.optimizers)
    optimizers.insert(sub, s.sharded() ? gatherOptimizerState(s, opt) : opt.stateDict());
  if (!s.isRankZero())
    return std::vector<char>();
  GANC_TRY(checkWeightsFinite(s, step));
  c10::impl::GenericDict ckpt = makeDict();
  ckpt.insert("format", std::string("ganc-checkpoint"));
  ckpt.insert("version", int64_t{1});
  ckpt.insert("step", step);
  ckpt.insert("images", s.imagesSeen);
  ckpt.insert("identity", s.plan->identity);
  ckpt.insert("spec", s.spec().text);
  std::map<std::string, c10::Dict<std::string, at::Tensor>> stateDicts;
  auto add = [&](const std::string &name, const at::Tensor &t) {
    auto [owner, rest] = splitOwner(name);
    stateDicts[owner].insert(rest, t.detach().cpu().clone());
  };
  for (const auto &p : s.module().named_parameters(true))
    add(p.name, p.value);
  for (const auto &b : s.module().named_buffers(true))
    add(b.name, b.value);
  for (auto &[owner, dict] : stateDicts)
    ckpt.insert(owner, dict);
  // The state dicts above hold rank 0's buffers (what a Python module loads); with local
  // buffers every rank's are kept too, by full name, so that each rank resumes its own.
  if (!localBuffers.empty())
    ckpt.insert("rank_buffers", localBuffers);
  ckpt.insert("optimizers", optimizers);
  c10::impl::GenericDict scalers = makeDict();
  for (const auto &[name, scaler] : s.lossScalers)
    scalers.insert(name, scaler.stateDict());
  ckpt.insert("loss_scalers", scalers);
  if (!s.controllers.empty()) {
    c10::impl::GenericDict controllers = makeDict();
    for (const auto &[name, controller] : s.controllers)
      controllers.insert(name, controller.stateDict());
    ckpt.insert("controllers", controllers);
  }
  c10::impl::GenericDict rng = makeDict();
  rng.insert("noise", c10::List<at::Tensor>(noise));
  if (!phase.empty())
    rng.insert("phase", c10::List<at::Tensor>(phase));
  rng.insert("world_size", int64_t{s.rank.worldSize});
  rng.insert("seed", static_cast<int64_t>(s.options.seed));
  rng.insert("batch_size", s.spec().batchSize);
  if (ShardedBatches *batches = inputs.batches()) {
    rng.insert("data_epoch", batches->epoch());
    rng.insert("data_cursor", batches->cursor());
  }
  ckpt.insert("rng", rng);
  if (s.best.step >= 0) {
    c10::impl::GenericDict best = makeDict();
    best.insert("metric", s.best.metric);
    best.insert("value", s.best.value);
    best.insert("step", s.best.step);
    best.insert("network", s.best.network);
    ckpt.insert("best", best);
  }
  if (!s.logInterval.empty())
    ckpt.insert("log_interval", s.logInterval);
  c10::Dict<std::string, std::string> settings;
  for (const auto &[key, value] : trainingSettings(s.spec(), *s.plan, inputs.dataDigest(),
                                                   static_cast<double>(s.stepImages())))
    settings.insert(key, value);
  ckpt.insert("settings", settings);
  return sealZipArchive(torch::pickle_save(ckpt));
}

} // namespace

Status writeCheckpoint(Session &s, PhaseInputs &inputs, int64_t step) {
  auto bytes = checkpointBytes(s, inputs, step);
  if (!bytes)
    return bytes.status();
  if (!s.isRankZero())
    return Status::ok();
  return storeCheckpoint(s.options.outDir, step, *bytes, s.options.keepCheckpoints);
}

Status writeBestCheckpoint(Session &s, PhaseInputs &inputs, int64_t step, bool written) {
  const std::string best = s.options.outDir + "/checkpoint-best.pt";
  if (written) { // checkpoint.pt is this step's: its bytes, copied
    if (!s.isRankZero())
      return Status::ok();
    auto bytes = readFile(s.options.outDir + "/checkpoint.pt");
    return bytes ? writeFileAtomically(best, *bytes) : bytes.status();
  }
  auto bytes = checkpointBytes(s, inputs, step);
  if (!bytes)
    return bytes.status();
  return s.isRankZero() ? writeFileAtomically(best, *bytes) : Status::ok();
}

namespace {

/// The version of the checkpoint format this ganc writes and reads.
constexpr int64_t kCheckpointVersion = 1;

/// The entries every checkpoint has, of the right kinds, and its version: one line naming the
/// first that is not.
Status checkLayout(const c10::impl::GenericDict &ckpt, const std::string &where) {
  using Check = bool (c10::IValue::*)() const;
  const std::vector<std::pair<const char *, Check>> entries = {
      {"version", &c10::IValue::isInt},
      {"step", &c10::IValue::isInt},
      {"identity", &c10::IValue::isString},
      {"rng", &c10::IValue::isGenericDict},
      {"optimizers", &c10::IValue::isGenericDict}};
  for (const auto &[key, is] : entries)
    if (!ckpt.contains(key) || !(ckpt.at(key).*is)())
      return Status::error(where +
                           (ckpt.contains(key) ? "'" + std::string(key) + "' is damaged"
                                               : "has no '" + std::string(key) + "'") +
                           " (not a whole ganc checkpoint)");
  const int64_t version = ckpt.at("version").toInt();
  if (version != kCheckpointVersion)
    return Status::error(where + "is a version " + std::to_string(version) +
                         " checkpoint; this ganc reads version " +
                         std::to_string(kCheckpointVersion) +
                         (version > kCheckpointVersion ? " (it was written by a newer ganc)" : ""));
  auto rng = ckpt.at("rng").toGenericDict();
  if (!rng.contains("world_size") || !rng.at("world_size").isInt() || !rng.contains("noise") ||
      !rng.at("noise").isList())
    return Status::error(where + "its 'rng' entry is damaged (not a whole ganc checkpoint)");
  return Status::ok();
}

/// Every parameter and buffer of the model, in its shape and dtype, every parameter finite,
/// and state for every optimizer group and loss scaler: one line naming the first that is not.
Status checkContents(const Session &s, const c10::impl::GenericDict &ckpt,
                     const std::string &where) {
  auto entry = [&](const std::string &name, const at::Tensor &mine, bool parameter) -> Status {
    auto [owner, rest] = splitOwner(name);
    if (!ckpt.contains(owner) || !ckpt.at(owner).isGenericDict() ||
        !ckpt.at(owner).toGenericDict().contains(rest) ||
        !ckpt.at(owner).toGenericDict().at(rest).isTensor())
      return Status::error(where + "has no tensor '" + name + "' (" +
                           (parameter ? "a parameter" : "a buffer") +
                           " of this model; a checkpoint of another version of it?)");
    const at::Tensor t = ckpt.at(owner).toGenericDict().at(rest).toTensor();
    if (t.sizes() != mine.sizes() || t.scalar_type() != mine.scalar_type())
      return Status::error(where + "'" + name + "' is " + c10::str(t.sizes()) + " " +
                           c10::toString(t.scalar_type()) + ", the model's is " +
                           c10::str(mine.sizes()) + " " + c10::toString(mine.scalar_type()));
    if (parameter && t.is_floating_point() && !t.isfinite().all().item<bool>())
      return Status::error(where + "'" + name +
                           "' holds NaN or inf values (training from it would stop at once)");
    return Status::ok();
  };
  for (const auto &p : s.archive->module.named_parameters(true))
    GANC_TRY(entry(p.name, p.value, true));
  for (const auto &b : s.archive->module.named_buffers(true))
    GANC_TRY(entry(b.name, b.value, false));
  for (const auto &[group, optimizer] : s.optimizers)
    if (!ckpt.at("optimizers").toGenericDict().contains(group))
      return Status::error(where + "has no optimizer state for group '" + group + "'");
  for (const auto &[name, scaler] : s.lossScalers)
    if (!ckpt.contains("loss_scalers") || !ckpt.at("loss_scalers").isGenericDict() ||
        !ckpt.at("loss_scalers").toGenericDict().contains(name))
      return Status::error(where + "has no state for loss scaler '" + name + "'");
  for (const auto &[name, controller] : s.controllers) {
    const bool kept = ckpt.contains("controllers") && ckpt.at("controllers").isGenericDict() &&
                      ckpt.at("controllers").toGenericDict().contains(name);
    const c10::IValue state =
        kept ? ckpt.at("controllers").toGenericDict().at(name) : c10::IValue();
    if (!kept || !state.isGenericDict() || !state.toGenericDict().contains("value") ||
        !state.toGenericDict().contains("totals") ||
        !state.toGenericDict().contains("interval_images") ||
        !state.toGenericDict().at("value").isTensor() ||
        !state.toGenericDict().at("totals").isTensor() ||
        state.toGenericDict().at("totals").toTensor().numel() != 2)
      return Status::error(where + "has no state for controller '" + name + "'");
  }
  return Status::ok();
}

/// The checkpoint at `path`, checked against this run: whole, a ganc checkpoint of this
/// format version, of this model (every tensor in place and finite), with this run's seed and
/// batch. `digest` is its bytes' digest.
Expected<c10::impl::GenericDict> readCheckpoint(const Session &s, const std::string &path,
                                                uint64_t &digest) {
  // Named as the command line gave it: --resume, or ganc metrics' checkpoint.
  const std::string flag = s.options.resumeFlag;
  auto bytes = readFile(path);
  if (!bytes)
    return bytes.status().withContext(flag);
  GANC_TRY(checkZipArchive(*bytes).withContext(flag + " " + path));
  digest = digestWords(kDigestStart, bytes->data(), bytes->size());
  c10::impl::GenericDict ckpt = makeDict();
  try {
    ckpt = torch::pickle_load(*bytes).toGenericDict();
  } catch (const std::exception &e) {
    return Status::error(flag + " " + path + ": not a ganc checkpoint (" + firstLine(e) + ")");
  }
  if (!ckpt.contains("format") || !ckpt.at("format").isString() ||
      ckpt.at("format").toStringRef() != "ganc-checkpoint")
    return Status::error(flag + " " + path + ": not a ganc checkpoint");
  const std::string where = flag + " " + path + ": ";
  GANC_TRY(checkLayout(ckpt, where));
  if (ckpt.at("identity").toStringRef() != s.plan->identity)
    return Status::error(flag + " " + path + ": written for another model");
  auto rng = ckpt.at("rng").toGenericDict();
  if (rng.contains("seed") && rng.at("seed").toInt() != static_cast<int64_t>(s.options.seed))
    return Status::error(flag + " " + path + ": written with --seed " +
                         std::to_string(rng.at("seed").toInt()) + ", resuming with --seed " +
                         std::to_string(s.options.seed) +
                         " would change the noise and data streams");
  if (rng.contains("batch_size") && rng.at("batch_size").toInt() != s.spec().batchSize)
    return Status::error(flag + " " + path + ": written with batch " +
                         std::to_string(rng.at("batch_size").toInt()) +
                         " per rank, resuming with " + std::to_string(s.spec().batchSize) +
                         " would change the data stream");
  GANC_TRY(checkContents(s, ckpt, where));
  return ckpt;
}

/// The checkpoint's training settings against this run's: a resume that changes them is
/// refused in one line naming each, unless --accept-changes (then they go to run.json).
Status compareSettings(Session &s, PhaseInputs &inputs, const c10::impl::GenericDict &ckpt,
                       const std::string &path) {
  s.acceptedChanges.clear();
  if (!ckpt.contains("settings")) // written before checkpoints kept their settings
    return Status::ok();
  if (!ckpt.at("settings").isGenericDict())
    return Status::error("--resume " + path + ": its 'settings' entry is damaged");
  std::map<std::string, std::string> then;
  for (const auto &entry : ckpt.at("settings").toGenericDict())
    if (entry.key().isString() && entry.value().isString())
      then[entry.key().toStringRef()] = entry.value().toStringRef();
  const std::map<std::string, std::string> now =
      trainingSettings(s.spec(), *s.plan, inputs.dataDigest(), static_cast<double>(s.stepImages()));
  std::string said;
  auto differs = [&](const std::string &key, const std::string &mine, const std::string &run) {
    // Checkpoints of 0.7 wrote the spec's beta beside a half-life: the half-life is the setting.
    if (mine == run ||
        (key == "--ema-half-life-images" && run.find(" (beta ") != std::string::npos &&
         mine.substr(0, mine.find(" (")) == run.substr(0, run.find(" (")) &&
         mine.substr(0, 2) != "0 "))
      return;
    said += (said.empty() ? "" : "; ") + key + " " + mine + " (the run's: " + run + ")";
    s.acceptedChanges[key] = mine + " (was " + run + ")";
  };
  for (const auto &[key, value] : now)
    differs(key, value, then.count(key) ? then.at(key) : "none");
  for (const auto &[key, value] : then)
    if (!now.count(key))
      differs(key, "none", value);
  if (said.empty() || s.options.acceptChanges)
    return Status::ok();
  return Status::error("--resume " + path + ": this resume changes what the run trains: " + said +
                       "; resume with the run's settings, or give --accept-changes to go on "
                       "with these (run.json records each change)");
}

/// --kimg counts the images every rank has trained on: after a resume (on as many ranks as
/// before or not) the run ends at the steps that bring the checkpoint's images to it.
Status continueKimg(Session &s, const std::string &path, int64_t step) {
  if (s.options.kimg <= 0)
    return Status::ok();
  const double goal = s.options.kimg * 1000.0;
  const auto seen = static_cast<double>(s.imagesSeen);
  if (seen >= goal)
    return Status::error("--resume " + path + ": the checkpoint has trained on " +
                         formatDouble(seen / 1000.0) + " kimg, so --kimg " +
                         formatDouble(s.options.kimg) + " leaves nothing to train");
  s.options.steps =
      step + static_cast<int64_t>(std::ceil((goal - seen) / static_cast<double>(s.stepImages())));
  return Status::ok();
}

} // namespace

Expected<int64_t> resumeCheckpoint(Session &s, PhaseInputs &inputs, const std::string &path,
                                   bool announce) {
  auto read = readCheckpoint(s, path, s.resumedDigest);
  if (!read)
    return read.status();
  c10::impl::GenericDict ckpt = read.take();
  auto rng = ckpt.at("rng").toGenericDict();
  const int64_t savedWorld = rng.at("world_size").toInt();
  const int64_t step = ckpt.at("step").toInt();
  // Older checkpoints did not count images: as many per step as this run stages.
  s.imagesSeen = ckpt.contains("images") ? ckpt.at("images").toInt()
                                         : step * s.spec().batchSize * s.rank.worldSize;
  GANC_TRY(continueKimg(s, path, step));
  if (step >= s.options.steps)
    return Status::error("--resume " + path + ": the checkpoint is at step " +
                         std::to_string(step) + ", so --steps " + std::to_string(s.options.steps) +
                         " leaves nothing to train (--steps counts from step 0)");
  if (ckpt.contains("best")) {
    auto best = ckpt.at("best").toGenericDict();
    s.best = {best.at("metric").toStringRef(), best.at("value").toDouble(), best.at("step").toInt(),
              best.contains("network") && best.at("network").isString()
                  ? best.at("network").toStringRef()
                  : std::string()};
  }
  GANC_TRY(compareSettings(s, inputs, ckpt, path));
  s.logInterval.clear();
  if (ckpt.contains("log_interval")) {
    if (!ckpt.at("log_interval").isString() ||
        !nlohmann::json::accept(ckpt.at("log_interval").toStringRef()))
      return Status::error("--resume " + path + ": its 'log_interval' is damaged");
    s.logInterval = ckpt.at("log_interval").toStringRef();
  }
  torch::NoGradGuard noGrad;
  auto restore = [&](const std::string &name, at::Tensor t) {
    auto [owner, rest] = splitOwner(name);
    t.copy_(ckpt.at(owner).toGenericDict().at(rest).toTensor());
  };
  for (const auto &p : s.module().named_parameters(true))
    restore(p.name, p.value);
  for (const auto &b : s.module().named_buffers(true))
    restore(b.name, b.value);
  auto optimizers = ckpt.at("optimizers").toGenericDict();
  for (auto &[sub, opt] : s.optimizers) {
    opt.loadStateDict(optimizers.at(sub).toGenericDict());
    if (s.sharded())
      opt.keepPieces(s.executor->parameters(), s.rank.worldSize, s.rank.rank);
  }
  for (auto &[name, scaler] : s.lossScalers)
    scaler.loadStateDict(ckpt.at("loss_scalers").toGenericDict().at(name).toGenericDict());
  for (auto &[name, controller] : s.controllers)
    controller.loadStateDict(ckpt.at("controllers").toGenericDict().at(name).toGenericDict());
  // On another number of ranks, the ranks the checkpoint had continue their noise and their
  // local buffers; a new rank starts its own (seed + rank) stream with rank 0's buffers, and
  // the data position carries over as the samples the epoch has used. Weights and optimizer
  // state continue exactly.
  if (s.rank.rank < savedWorld) {
    if (ckpt.contains("rank_buffers") && s.spec().buffers == "local") {
      auto mine = ckpt.at("rank_buffers").toList().get(s.rank.rank).toGenericDict();
      for (const auto &b : s.module().named_buffers(true))
        b.value.copy_(mine.at(b.name).toTensor());
    }
    inputs.noise().set_state(rng.at("noise").toList().get(s.rank.rank).toTensor());
    if (rng.contains("phase") && !s.device.is_cuda())
      inputs.phaseRandom().set_state(rng.at("phase").toList().get(s.rank.rank).toTensor());
  }
  if (ShardedBatches *batches = inputs.batches(); batches && rng.contains("data_epoch"))
    batches->seek(rng.at("data_epoch").toInt(),
                  rng.at("data_cursor").toInt() * savedWorld / s.rank.worldSize);
  if (s.isRankZero() && announce) {
    std::cout << "resumed from " << path << " at step " << step << std::endl;
    if (savedWorld != s.rank.worldSize)
      std::cout << "the checkpoint was written by " << savedWorld
                << (savedWorld == 1 ? " rank" : " ranks") << ", this run has " << s.rank.worldSize
                << ": weights and optimizer state continue as they were; "
                << "noise and data are dealt to the new ranks afresh" << std::endl;
  }
  return step;
}

Status checkRanksStartAlike(Session &s, int64_t step, uint64_t dataDigest) {
  if (s.rank.worldSize == 1)
    return Status::ok();
  // The digests' top bits dropped: int64 on the wire.
  const auto digest = static_cast<int64_t>(s.resumedDigest >> 1);
  const auto data = static_cast<int64_t>(dataDigest >> 1);
  const std::vector<at::Tensor> starts =
      allGatherToCpu(s, torch::tensor({step, digest, data}, torch::kLong).to(s.device));
  bool alike = true, sameData = true;
  for (const at::Tensor &start : starts) {
    alike = alike && torch::equal(start.narrow(0, 0, 2), starts.front().narrow(0, 0, 2));
    sameData = sameData && start[2].item<int64_t>() == starts.front()[2].item<int64_t>();
  }
  if (alike && sameData)
    return Status::ok();
  std::string ranks;
  for (size_t r = 0; r < starts.size(); ++r) {
    const int64_t at = starts[r][0].item<int64_t>(), d = starts[r][alike ? 2 : 1].item<int64_t>();
    char text[96];
    if (!alike)
      std::snprintf(text, sizeof(text), "%srank %zu at step %lld (%s)", r ? ", " : "", r,
                    static_cast<long long>(at),
                    d ? ("checkpoint " + std::to_string(d % 1000000)).c_str() : "no checkpoint");
    else
      std::snprintf(text, sizeof(text), "%srank %zu data %s", r ? ", " : "", r,
                    d ? ("digest " + std::to_string(d % 1000000)).c_str() : "none");
    ranks += text;
  }
  if (!alike)
    return Status::error("the ranks do not start from the same checkpoint: " + ranks +
                         "; give every rank the same --resume (with --resume auto, the same --out "
                         "contents on every node)");
  return Status::error("the ranks loaded different data sets (" + ranks + ", from --data " +
                       s.options.data +
                       " on this rank): every rank must train on the same data (on several "
                       "nodes, the same files at each node's --data)");
}

} // namespace ganc::runtime
