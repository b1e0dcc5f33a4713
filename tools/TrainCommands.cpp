// `ganc train` and `ganc run`: their options, parsed into the runtime's TrainOptions.
#include "tools/TrainCommands.h"

#include "frontend/SpecSchema.h"
#include "runtime/dist/Launcher.h"
#include "runtime/rundir/Stop.h"
#include "runtime/step/Trainer.h"
#include "support/Options.h"
#include "support/TextFormat.h"
#include "tools/CommonOptions.h"
#include "tools/MetricsCommand.h"

#include <algorithm>
#include <c10/util/Logging.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <thread>

namespace ganc::tools {

using runtime::TrainOptions;

namespace {

/// A rank's final error: to the launcher's error file under `ganc run` (it prints each
/// distinct line once), else to stderr.
void reportError(const std::string &message) {
  if (const char *path = std::getenv(runtime::kErrorFileVariable)) {
    std::ofstream out(path, std::ios::app);
    if (out << message << "\n" && out.flush())
      return;
  }
  std::cerr << "ganc: error: " << message << std::endl;
}

int usageError(const std::string &message) {
  reportError(message);
  return 2;
}

/// `text` as the spec's `object`.`key` takes it (its rule in frontend/SpecFields.def), so an
/// option over a spec field takes what the field takes; else "FLAG takes FORM RULE, not 'TEXT'"
/// (FORM: how the option spells it, "PHASE=K with K").
double specNumber(const std::string &flag, const std::string &text, const char *object,
                  const char *key, const std::string &form = "") {
  const frontend::ValueRule &rule = frontend::specField(object, key).value;
  if (frontend::isNamed(rule, text))
    return std::numeric_limits<double>::infinity(); // "inf", a norm's
  const std::optional<double> v = parseDouble(text);
  if (v && std::isfinite(*v) && frontend::withinBounds(rule, *v))
    return *v;
  std::string described =
      form.empty() ? frontend::ruleText(rule) : form + " " + frontend::boundsText(rule);
  if (!form.empty() && *rule.names)
    described += std::string(" or \"") + rule.names + "\"";
  throw OptionError(flag + " takes " + described + ", not '" + text + "'");
}

/// One of the names the spec's `object`.`key` takes ("stop", "skip").
std::string specName(const std::string &flag, const std::string &text, const char *object,
                     const char *key, const std::string &form = "") {
  const frontend::ValueRule &rule = frontend::specField(object, key).value;
  if (frontend::isNamed(rule, text))
    return text;
  throw OptionError(flag + " takes " + form + frontend::ruleText(rule) + ", not '" + text + "'");
}

/// An interval in steps (--log-every ...), noted as given (--tick-kimg and --snap refuse to
/// replace one).
Stored<TrainOptions> interval(int64_t TrainOptions::*member, int64_t low) {
  return {[member, low](const std::string &f, const std::string &v, TrainOptions &o) {
            o.*member = integerIn(f, v, low, std::numeric_limits<int64_t>::max());
            o.intervalsGiven.push_back(f);
          },
          recordMember(member)};
}

/// `ganc train`'s options for what runs and what it writes.
std::vector<Option<TrainOptions>> runOptions() {
  using O = TrainOptions;
  using S = const std::string;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return {
      {"--model", "PATH", "the archive PLAN was compiled from (checked)", storeText(&O::model)},
      {"--op-library", "LIB.so",
       "a TORCH_LIBRARY operator library the archive's code calls (the archive names the ones "
       "it needs); repeat it or list with commas",
       appendPaths(&O::opLibraries)},
      {"--data", "PATH",
       "torch.save tensor file [N, *data.shape] in [-1, 1], or a folder of PNG/JPEG images "
       "(resized to the spec's data shape)",
       storeText(&O::data)},
      {"--steps", "N", "training steps (default 1000); a phase runs when step % interval == 0",
       recorded<O>(
           [](S &f, S &v, O &o) {
             o.steps = integerIn(f, v, 0, kMax);
             o.stepsGiven = true;
           },
           recordMember(&O::steps))},
      {"--kimg", "K",
       "the run's length in thousands of real images over every rank (StyleGAN's --kimg), in "
       "place of --steps: the steps that reach it (each trains batch x ranks x the data phases' "
       "micro-batches images)",
       recorded<O>([](S &f, S &v, O &o) { o.kimg = realIn(f, v, 0.001, 1e12); },
                   recordMember(&O::kimg))},
      {"--tick-kimg", "K",
       "a progress line every K thousand real images over every rank (StyleGAN's --tick), in "
       "place of --log-every, opening as train.py's tick line: tick, kimg, time, sec/tick, "
       "sec/kimg, cpumem, augment",
       recorded<O>([](S &f, S &v, O &o) { o.tickKimg = realIn(f, v, 0.001, 1e12); },
                   recordMember(&O::tickKimg))},
      {"--snap", "N",
       "with --tick-kimg: the sample grid and a checkpoint every N ticks (StyleGAN's --snap), "
       "in place of --sample-every and --checkpoint-every",
       storeInteger(&O::snap, 1, kMax)},
      {"--out", "DIR",
       "the run's directory (default ganc-out): samples, stats.jsonl, TensorBoard events, "
       "checkpoints, run.json (options and effective spec); one that holds a run is refused "
       "without --resume or --force",
       storeText(&O::outDir)},
      {"--force", "",
       "start over in an --out that holds a run (its files are removed; its checkpoint.pt is "
       "kept as checkpoint-replaced.pt until the new run writes one, and never resumed)",
       storeTrue(&O::force)},
      {"--accept-changes", "",
       "resume with settings that differ from the checkpoint's (--lr, --betas, --clip, "
       "--accumulate, --precision, --interval, --ema-half-life-images, the data): each change "
       "is recorded in run.json; without it such a resume is refused, naming them",
       storeTrue(&O::acceptChanges)},
      {"--seed", "S", "data order and noise seed (rank r draws noise from seed + r)",
       recorded<O>(
           [](S &f, S &v, O &o) { o.seed = static_cast<uint64_t>(integerIn(f, v, 0, kMax)); },
           recordMember(&O::seed))},
      {"--resume", "CKPT|auto",
       "continue exactly from a checkpoint; auto: from --out's checkpoint.pt (where it is "
       "damaged or missing, the newest whole step snapshot), or from step 0 if --out holds no "
       "checkpoint (for restarted torchrun workers); where every checkpoint there is damaged, "
       "it stops and changes nothing",
       storeText(&O::resume)},
      {"--tensorboard", "on|off",
       "TensorBoard event files in --out, written beside the run by python -m "
       "ganc.tensorboard (default on)",
       storeChoice(&O::tensorboard, onOff())},
  };
}

/// What a run writes, and how often: progress, sample grids, checkpoints, metrics.
std::vector<Option<TrainOptions>> writtenOptions() {
  using O = TrainOptions;
  using S = const std::string;
  return {
      {"--log-every", "N", "progress line every N steps (default 50)", interval(&O::logEvery, 1)},
      {"--sample-every", "N", "sample grid every N steps and at the end (default 500, 0: never)",
       interval(&O::sampleEvery, 0)},
      {"--checkpoint-every", "N",
       "checkpoint every N steps and at the end (default 1000, 0: never)",
       interval(&O::checkpointEvery, 0)},
      {"--keep-checkpoints", "N",
       "step checkpoints (checkpoint-STEP.pt) kept besides checkpoint.pt, the latest (default "
       "3, 0: checkpoint.pt only)",
       storeInteger(&O::keepCheckpoints, 0, 1000000)},
      // The grid is one forward of the generator: 32 x 32 images at most (a typo of 200000
      // took 23 GB of host memory and four minutes, and wrote a 380 MB PNG).
      {"--samples", "N", "images in the sample grid (default 64, at most 1024)",
       storeInteger(&O::samples, 1, 1024)},
      {"--metrics", "fid50k,kid50k",
       "quality metrics: fidN or kidN with N images generated, shared out to the ranks (real "
       "images: the data set's first N, or all of it with _full: fid50k_full); in "
       "metrics.jsonl, stats.jsonl (Metrics/NAME), TensorBoard and the progress line; the first "
       "one ranks snapshots (checkpoint-best.pt)",
       recorded<O>([](S &, S &v, O &o) { tools::appendMetricNames(v, o.metrics); },
                   recordMember(&O::metrics))},
      {"--metrics-every", "KIMG",
       "compute --metrics each time another KIMG thousand real images are trained on, and at "
       "the end (default 0: at the end only)",
       recorded<O>([](S &f, S &v, O &o) { o.metricsEveryKimg = realIn(f, v, 0, 1e12); },
                   recordMember(&O::metricsEveryKimg))},
      {"--inception", "PATH",
       "the feature network of --metrics: inception-2015-12-05.pt, a TorchScript file NVIDIA "
       "publishes (default $GANC_INCEPTION, else ~/.cache/ganc/inception-2015-12-05.pt)",
       storeText(&O::inception)},
  };
}

/// The training recipe over the spec's (re-planned in memory at start-up).
std::vector<Option<TrainOptions>> recipeOptions() {
  using O = TrainOptions;
  using S = const std::string;
  return {
      {"--lr", "[GROUP=]X", "learning rate of every optimizer group, or of GROUP (repeatable)",
       [](S &f, S &v, O &o) {
         auto [group, text] = keyed(v);
         o.lr[group] = specNumber(f, text, "optimizer", "lr");
       }},
      {"--betas", "[GROUP=]B1,B2", "Adam betas of every Adam group, or of GROUP (repeatable)",
       [](S &f, S &v, O &o) {
         auto [group, text] = keyed(v);
         const size_t comma = text.find(',');
         if (comma == std::string::npos)
           throw OptionError(f + " takes B1,B2 (e.g. 0,0.99), not '" + text + "'");
         o.betas[group] = {specNumber(f, text.substr(0, comma), "optimizer", "betas", "B1,B2"),
                           specNumber(f, text.substr(comma + 1), "optimizer", "betas", "B1,B2")};
       }},
      {"--interval", "PHASE=K",
       "run PHASE every K steps instead of the spec's interval (repeatable)",
       [](S &f, S &v, O &o) {
         auto [phase, text] = keyed(v);
         if (phase.empty())
           throw OptionError(f + " takes PHASE=K (e.g. d_reg=16), not '" + text + "'");
         o.intervals[phase] =
             static_cast<int64_t>(specNumber(f, text, "phase", "interval", "PHASE=K with K"));
       }},
      {"--precision", "[PHASE=]P",
       "autocast every phase's (or PHASE's) forward to P: float32, bfloat16 or float16, "
       "instead of the spec's (repeatable)",
       [](S &f, S &v, O &o) {
         auto [phase, text] = keyed(v);
         o.precision[phase] = specName(f, text, "phase", "precision", "[PHASE=]");
       }},
      {"--accumulate", "PHASE=K",
       "PHASE takes K micro-batches per step (the spec's `accumulate`; repeatable)",
       [](S &f, S &v, O &o) {
         auto [phase, text] = keyed(v);
         if (phase.empty())
           throw OptionError(f + " takes PHASE=K (e.g. Dmain=2), not '" + text + "'");
         o.accumulate[phase] =
             static_cast<int64_t>(specNumber(f, text, "phase", "accumulate", "PHASE=K with K"));
       }},
      {"--clip", "GROUP=MAX[,TYPE]",
       "clip GROUP's all-reduced gradients to a TYPE-norm (default 2, or inf) of MAX (0: no "
       "clipping; repeatable), as the spec's `clip_grad_norm`",
       [](S &f, S &v, O &o) {
         auto [group, text] = keyed(v);
         if (group.empty())
           throw OptionError(f + " takes GROUP=MAX_NORM[,TYPE] (e.g. generator=1.0), not '" + text +
                             "'");
         const size_t comma = text.find(',');
         const std::string max = text.substr(0, comma);
         const double maxNorm =
             max == "0" ? 0 : specNumber(f, max, "clip", "max_norm", "GROUP=MAX (0: off) with MAX");
         double type = frontend::defaultOf<double>("clip", "norm_type");
         if (comma != std::string::npos)
           type = specNumber(f, text.substr(comma + 1), "clip", "norm_type",
                             "GROUP=MAX,TYPE with TYPE");
         o.clip[group] = {maxNorm, type};
       }},
      {"--ema-half-life-images", "N",
       "G_ema's half-life in images instead of the spec's (0: beta 0)",
       [](S &f, S &v, O &o) { o.emaHalfLifeImages = specNumber(f, v, "ema", "half_life_images"); }},
      {"--batch-size", "N", "batch per rank instead of the spec's",
       storeInteger(&O::batchSize, 1, 1 << 24)},
  };
}

/// Devices, collectives and CUDA Graphs.
std::vector<Option<TrainOptions>> deviceOptions() {
  using O = TrainOptions;
  using S = const std::string;
  return {
      {"--device", "cpu|cuda",
       "cpu: Gloo; cuda: NCCL, one GPU per rank (cuda:LOCAL_RANK), each phase captured once "
       "as a CUDA Graph and replayed",
       storeText(&O::device)},
      {"--dist-backend", choiceValue(runtime::distBackendNames()),
       "collectives: auto is Gloo on CPU, NCCL on CUDA; gloo on CUDA runs eagerly "
       "(--cuda-graphs off) and lets ranks share a GPU (cuda:LOCAL_RANK % GPUs), to debug "
       "several ranks on one GPU",
       storeChoice(&O::distBackend, runtime::distBackendNames())},
      {"--cuda-graphs", "on|off|step",
       "on: capture each phase and replay it (default); step: also launch each step's phases "
       "as one graph once all are captured; off: run every phase eagerly on the GPU",
       recorded<O>(
           [](S &f, S &v, O &o) {
             const int mode = choice<int>(f, v, {{"on", 1}, {"off", 0}, {"step", 2}});
             o.cudaGraphs = mode != 0;
             o.stepGraphs = mode == 2;
           },
           [](const O &o) {
             return nlohmann::json(o.cudaGraphs ? (o.stepGraphs ? "step" : "on") : "off");
           })},
      {"--comm-stream", choiceValue(runtime::commStreamNames()),
       "NCCL: run the gradient collectives on NCCL's own stream, overlapping backward (side), "
       "or in order on the compute stream, which makes each captured phase one straight line "
       "of nodes (compute); auto: compute with one rank, side with more",
       storeChoice(&O::commStream, runtime::commStreamNames())},
      {"--memset-nodes", choiceValue(runtime::graphNodesNames()),
       "CUDA Graphs: each captured memset node (up to 1 MiB) becomes a kernel node writing the "
       "same bytes, which the GPU starts with less idle around it (kernel, the default), or "
       "the graphs stay as captured (keep)",
       storeChoice(&O::memsetNodes, runtime::graphNodesNames())},
      {"--copy-nodes", choiceValue(runtime::graphNodesNames()),
       "CUDA Graphs: likewise each captured copy between two places in the GPU's memory (up "
       "to 1 MiB) becomes a kernel node (kernel, the default), or stays a copy node (keep)",
       storeChoice(&O::copyNodes, runtime::graphNodesNames())},
      {"--upload-stream", choiceValue(runtime::uploadStreamNames()),
       "CUDA: each data batch goes from its pinned host buffer to the GPU on a stream of its "
       "own, beside the queued phases (copy, the default), or in order on the compute stream "
       "(compute)",
       storeChoice(&O::uploadStream, runtime::uploadStreamNames())},
      {"--warmup", "N",
       "eager iterations of each phase before its capture (default 3, at least 1: optimizer "
       "state is created there, outside the graph)",
       storeInteger(&O::warmup, 0, 1000000)},
      {"--deterministic", "",
       "CUDA: deterministic cuDNN and PyTorch kernels, no cuDNN benchmark (bitwise-"
       "reproducible runs; what the GPU parity tests use)",
       storeTrue(&O::deterministic)},
      {"--cudnn-benchmark", "on|off", "CUDA: time cuDNN algorithms during warm-up (default on)",
       storeChoice(&O::cudnnBenchmark, onOff())},
      {"--memory-format", choiceValue(runtime::memoryFormatNames()),
       "layout of 4-D weights, buffers and data (default auto: channels_last on CUDA, "
       "contiguous on CPU)",
       storeChoice(&O::memoryFormat, runtime::memoryFormatNames())},
      {"--executor", choiceValue(runtime::phaseExecutorNames()),
       "what runs each phase: its joint graph of ATen ops (forward, gradient penalties and "
       "parameter gradients as one list, which ganc.export captures wherever it can) through "
       "ganc's own executor, each bucket's all-reduce started where the plan places it in the "
       "graph, or TorchScript's interpreter with PyTorch's autograd. auto (the default): the "
       "joint graph on the CPU where the archive holds one, TorchScript elsewhere and on CUDA; "
       "joint insists on the graph (CPU only); torchscript declines it",
       storeChoice(&O::executor, runtime::phaseExecutorNames())},
      {"--fusion", choiceValue(runtime::fusionNames()),
       "run the plan's fused resamplings and bias + activations as ganc's ops (on) or as written "
       "(off); auto (the default): on CUDA, off on the CPU (bit for bit as eager DDP there)",
       storeChoice(&O::fusion, runtime::fusionNames())},
      {"--double-backward", choiceValue(runtime::doubleBackwardNames()),
       "phases that differentiate twice (R1, path length, gradient penalties): their grouped "
       "convolutions whose weight takes no gradient (FIR filters) get a double backward of "
       "one call per gradient, bit for bit PyTorch's results (filters, the default); every "
       "grouped convolution does, modulated ones too, equal to rounding (grouped); or all keep "
       "PyTorch's, one convolution per group (pytorch); it sets the plan's `double_backward` "
       "of the phases ganc compile gave it",
       storeChoice(&O::doubleBackward, runtime::doubleBackwardNames())},
  };
}

/// Failure handling, sharding, threads, and what a run dumps or profiles.
std::vector<Option<TrainOptions>> diagnosticOptions() {
  using O = TrainOptions;
  using S = const std::string;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return {
      {"--timeout-s", "S", "give up on a silent peer after S seconds (default 120)",
       storeInteger(&O::timeoutSeconds, 1, 1000000000)},
      {"--non-finite", "stop|skip",
       "a non-finite loss or gradient (phases without a loss scaler): stop with exit 1, or "
       "skip the optimizer step and count it (default: the spec's non_finite, else stop)",
       recorded<O>([](S &f, S &v, O &o) { o.nonFinite = specName(f, v, "spec", "non_finite"); },
                   recordMember(&O::nonFinite))},
      {"--zero", "0|1|2",
       "sharded optimizer state instead of the plan's (spec's) stage: 1 shards optimizer "
       "state, 2 gradients as well, 0 off",
       recorded<O>([](S &f, S &v, O &o) { o.zero = zeroStage(f, v); }, recordMember(&O::zero))},
      {"--threads", "N", "intra-op threads per rank (default: cores / local ranks)",
       storeInteger(&O::threads, 1, 4096)},
      {"--dump-grads", "DIR", "rank 0 writes every all-reduced gradient (parity tests)",
       storeText(&O::dumpDir)},
      {"--profile", "FILE",
       "rank 0 writes each phase's timing (compute, when each bucket was ready, the "
       "optimizer) for `ganc simulate` (CPU ranks)",
       storeText(&O::profile)},
      {"--kernel-time", "N",
       "CUDA: the last N steps run under the CUDA profiler; timing.json's kernel_time holds "
       "how long the GPU was busy in them (the union of its kernels, copies and memsets) and "
       "their wall time",
       storeInteger(&O::kernelTimeSteps, 1, kMax)},
      {"--kernel-trace", "FILE",
       "with --kernel-time: rank 0 writes that window's trace here (Chrome trace JSON, for "
       "Perfetto or chrome://tracing)",
       storeText(&O::kernelTraceFile)},
  };
}

/// Every option of `ganc train` (and so of `ganc run`), in the order `--help` lists them.
std::vector<Option<TrainOptions>> trainOptionTable() {
  std::vector<Option<TrainOptions>> all;
  for (auto group : {runOptions, writtenOptions, recipeOptions, deviceOptions, diagnosticOptions})
    for (Option<TrainOptions> &option : group())
      all.push_back(std::move(option));
  return all;
}

const Command<TrainOptions> &trainTable() {
  static const Command<TrainOptions> command = {
      {"ganc train",
       {"PLAN --model MODEL.pt [options]"},
       "One rank of training: the plan's phases by interval, their all-reduces, optimizers, "
       "logging, sample grids and checkpoints. Ranks come from RANK, WORLD_SIZE, LOCAL_RANK, "
       "MASTER_ADDR and MASTER_PORT (torchrun's contract); `ganc run` starts local ones.",
       {},
       ""},
      trainOptionTable(),
      [](const std::string &argument, TrainOptions &o) {
        if (!o.plan.empty())
          throw OptionError("unexpected argument '" + argument + "'");
        o.plan = argument;
      }};
  return command;
}

/// Whether `text` is UTF-8: well-formed sequences, no overlong forms, surrogates or code
/// points past U+10FFFF.
bool isUtf8(const std::string &text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int length = c < 0x80         ? 1
                       : (c >> 5) == 6  ? 2
                       : (c >> 4) == 14 ? 3
                       : (c >> 3) == 30 ? 4
                                        : 0;
    if (length == 0 || i + length > text.size())
      return false;
    uint32_t point = length == 1 ? c : c & (0x7f >> length);
    for (int k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next >> 6) != 2)
        return false;
      point = (point << 6) | (next & 0x3f);
    }
    static const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (point < smallest[length] || point > 0x10ffff || (point >= 0xd800 && point <= 0xdfff))
      return false;
    i += static_cast<size_t>(length);
  }
  return true;
}

/// Paths are recorded in run.json, stats and summaries, which are JSON text: a path that is not
/// UTF-8 would fail the first such write (the end of a run, for summary.json), so it is refused
/// before anything runs.
Status checkPathsAreText(const TrainOptions &o) {
  std::vector<std::pair<std::string, std::string>> paths = {{"PLAN", o.plan},
                                                            {"--model", o.model},
                                                            {"--data", o.data},
                                                            {"--out", o.outDir},
                                                            {"--resume", o.resume},
                                                            {"--inception", o.inception},
                                                            {"--dump-grads", o.dumpDir},
                                                            {"--profile", o.profile},
                                                            {"--kernel-trace", o.kernelTraceFile}};
  for (const std::string &library : o.opLibraries)
    paths.emplace_back("--op-library", library);
  for (const auto &[flag, path] : paths)
    if (!isUtf8(path))
      return Status::error(
          flag + " " + path +
          ": the path is not valid UTF-8, and ganc records paths in JSON (run.json, "
          "summary.json); rename it, or link it under a UTF-8 name");
  return Status::ok();
}

/// The checks between options, after parsing: one line each.
Status checkTrain(const TrainOptions &o) {
  GANC_TRY(checkPathsAreText(o));
  using runtime::CommStream;
  using runtime::DistBackend;
  using runtime::GraphNodes;
  if (o.plan.empty())
    return Status::error("no PLAN given (ganc train PLAN --model MODEL.pt)");
  if (o.model.empty())
    return Status::error("no --model given: the archive the plan was compiled from");
  if (o.force && !o.resume.empty())
    return Status::error("--force starts over and --resume continues: give one of them");
  if (o.distBackend == DistBackend::Nccl && o.device != "cuda")
    return Status::error(
        "--dist-backend nccl needs --device cuda: NCCL runs on GPUs (CPU ranks use Gloo)");
  if (o.distBackend == DistBackend::Gloo && o.device == "cuda" && o.cudaGraphs)
    return Status::error("--dist-backend gloo on CUDA needs --cuda-graphs off: Gloo copies "
                         "device tensors through the host, which a captured CUDA Graph cannot "
                         "hold");
  if (o.commStream != CommStream::Auto &&
      (o.device != "cuda" || o.distBackend == DistBackend::Gloo))
    return Status::error("--comm-stream " +
                         runtime::nameOf(o.commStream, runtime::commStreamNames()) +
                         " places NCCL's collectives on a CUDA stream: it needs --device cuda "
                         "with NCCL (Gloo runs collectives on its own threads)");
  for (const auto &[flag, value] :
       {std::pair<const char *, GraphNodes>{"--memset-nodes", o.memsetNodes},
        {"--copy-nodes", o.copyNodes}})
    if (value != GraphNodes::Kernel && (o.device != "cuda" || !o.cudaGraphs))
      return Status::error(std::string(flag) + " keep changes captured CUDA Graphs: it needs "
                                               "--device cuda with --cuda-graphs on or step");
  if (o.uploadStream != runtime::UploadStream::Copy && o.device != "cuda")
    return Status::error("--upload-stream compute places the data batch's host-to-device copy "
                         "on a CUDA stream: it needs --device cuda");
  if (!o.kernelTraceFile.empty() && o.kernelTimeSteps == 0)
    return Status::error(
        "--kernel-trace FILE writes the --kernel-time window's trace: give --kernel-time N too");
  if (o.kernelTimeSteps > 0 && o.device != "cuda")
    return Status::error("--kernel-time traces GPU kernels: it needs --device cuda");
  if ((o.metricsEveryKimg > 0 || !o.inception.empty()) && o.metrics.empty())
    return Status::error(std::string(o.metricsEveryKimg > 0 ? "--metrics-every" : "--inception") +
                         " sets how --metrics run: give --metrics too (e.g. --metrics fid50k)");
  if (o.device == "cuda" && o.cudaGraphs && o.warmup < 1)
    return Status::error("--warmup must be at least 1 with CUDA Graphs: optimizer state is "
                         "created in the eager warm-up, outside the captured graph");
  return Status::ok();
}

/// Parses and checks train's command line; `help` says --help was asked for.
Status parseTrain(const std::vector<std::string> &args, TrainOptions &o, bool &help) {
  GANC_TRY(trainTable().parse(args, o, help));
  o.record = [](const TrainOptions &options) { return recordOf(trainTable().options, options); };
  return help ? Status::ok() : checkTrain(o);
}

/// `ganc run`'s own option; the rest are train's, passed to every rank.
struct RunArgs {
  std::optional<int64_t> nproc;
};

CommandDoc runDoc() {
  CommandDoc doc = trainTable().documented();
  doc.name = "ganc run";
  doc.synopsis = {"--nproc N PLAN --model MODEL.pt [train options]"};
  doc.description = "Starts N local ranks of `ganc train` on a free port, with the options of "
                    "`ganc train` below, and waits for all of them; a failed rank stops the "
                    "others and its error is printed once.";
  doc.options.insert(doc.options.begin(),
                     {"--nproc", "N", "local ranks to start (at most 4 per core)", {}});
  return doc;
}

} // namespace

CommandDoc trainCommandDoc() { return trainTable().documented(); }
CommandDoc runCommandDoc() { return runDoc(); }

int trainCommand(const std::vector<std::string> &args) {
  TrainOptions options;
  bool help = false;
  if (Status s = parseTrain(args, options, help); !s)
    return usageError("train: " + s.message());
  if (help) {
    std::cout << trainCommandDoc().usage();
    return 0;
  }
  // c10d logs every failed rendezvous attempt with a stack trace; ganc reports the failure
  // in one line. PyTorch's own TORCH_CPP_LOG_LEVEL brings those logs back.
  if (!std::getenv("TORCH_CPP_LOG_LEVEL"))
    FLAGS_caffe2_log_level = 3; // FATAL only
  Status status = runtime::train(options);
  if (!status)
    reportError(status.message());
  else if (const int signal = runtime::StopSignals::stoppedBy())
    return 128 + signal; // stopped at a step by SIGINT or SIGTERM, as a shell reports it
  return status.exitCode();
}

int runCommand(const std::string &self, const std::vector<std::string> &args) {
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    std::cout << runDoc().usage();
    return 0;
  }
  std::optional<int64_t> nproc;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag, value;
    if (splitInlineValue(args[i], flag, value) && flag == "--nproc")
      nproc = parseInt64(value);
    else if (args[i] == "--nproc" && i + 1 < args.size())
      nproc = parseInt64(args[++i]);
    else
      rest.push_back(args[i]);
  }
  if (!nproc || *nproc < 1)
    return usageError("run: --nproc N (N >= 1) says how many local ranks to start");
  // Every rank is a process holding LibTorch and the model: past a few per core they only
  // wait for each other (and 100000 of them would exhaust the machine before a step).
  const int64_t cores = std::max(1U, std::thread::hardware_concurrency());
  const int64_t most = std::max<int64_t>(8, 4 * cores);
  if (*nproc > most)
    return usageError("run: --nproc " + std::to_string(*nproc) +
                      " is more local ranks than this machine's " + std::to_string(cores) +
                      " cores can run (at most " + std::to_string(most) +
                      "); ranks on several machines start with torchrun or srun");
  TrainOptions check;
  bool help = false;
  if (Status s = parseTrain(rest, check, help); !s)
    return usageError("run: " + s.message());

  return runtime::launchLocalRanks(self, static_cast<int>(*nproc), rest);
}

} // namespace ganc::tools
