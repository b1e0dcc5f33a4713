// What `ganc train` is told: the options of one rank (each row of tools/TrainCommands.cpp's
// table sets one) and the spellings of their enums, on the command line and in run.json.
#pragma once

#include "ir/Module.h"
#include "support/Status.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ganc::runtime {

/// The collectives' backend: auto is Gloo on CPU, NCCL on CUDA.
enum class DistBackend { Auto, Nccl, Gloo };
/// Where NCCL's gradient collectives run (see TrainOptions::commStream).
enum class CommStream { Auto, Side, Compute };
/// What becomes of small memset or copy nodes in a captured CUDA Graph.
enum class GraphNodes { Kernel, Keep };
/// The stream a data batch's host-to-device copy runs on.
enum class UploadStream { Copy, Compute };
/// The layout of 4-D weights, buffers and data.
enum class MemoryFormat { Auto, ChannelsLast, Contiguous };
/// Whose double backward the grouped convolutions of a phase that differentiates twice take.
enum class DoubleBackward { Filters, Grouped, PyTorch };
/// What runs a phase: its joint graph through ganc's own executor where the plan holds one and
/// the device is the CPU, else TorchScript (auto); TorchScript's interpreter with PyTorch's
/// autograd; or every phase's joint graph, refusing a run where one has none.
enum class PhaseExecutor { Auto, TorchScript, Joint };
/// Whether the phases run the ops the plan fused (ganc::upfirdn2d, ganc::bias_act): auto (on
/// CUDA, where ganc's kernels are faster than the compositions they replace, e.g. the resampling
/// of StyleGAN2's G and D at 256 pixels 1.35x on an H200; off on the CPU, where the fused ops are
/// compositions of the same ATen kernels that gain nothing measured and only change the
/// roundings, so a CPU run stays bit for bit equal to eager DDP), on, off.
enum class Fusion { Auto, On, Off };

/// Each enum's spellings, on the command line and in run.json.
template <typename E> using Spellings = std::vector<std::pair<std::string, E>>;
const Spellings<DistBackend> &distBackendNames();
const Spellings<CommStream> &commStreamNames();
const Spellings<GraphNodes> &graphNodesNames();
const Spellings<UploadStream> &uploadStreamNames();
const Spellings<MemoryFormat> &memoryFormatNames();
const Spellings<DoubleBackward> &doubleBackwardNames();
const Spellings<PhaseExecutor> &phaseExecutorNames();
const Spellings<Fusion> &fusionNames();
/// The spelling of `value` in `names`.
template <typename E> const std::string &nameOf(E value, const Spellings<E> &names) {
  for (const auto &entry : names)
    if (entry.second == value)
      return entry.first;
  return names.front().first;
}

struct TrainOptions {
  std::string plan;
  std::string model;
  /// --op-library: TORCH_LIBRARY operator libraries the archive's code calls, loaded first.
  std::vector<std::string> opLibraries;
  std::string data;
  std::string outDir = "ganc-out";
  /// A checkpoint to continue from, or "auto": outDir's latest checkpoint if there is one,
  /// else a fresh start (what a restarted torchrun worker passes).
  std::string resume;
  /// Start over in an outDir that holds a run (its files are replaced).
  bool force = false;
  /// Resume with settings that differ from the checkpoint's (recorded in run.json); without
  /// it such a resume is refused, naming them.
  bool acceptChanges = false;
  /// Step checkpoints kept besides checkpoint.pt, the latest (0: checkpoint.pt only).
  int64_t keepCheckpoints = 3;
  /// Rank 0 starts a TensorBoard event writer (python -m ganc.tensorboard) beside the run.
  bool tensorboard = true;
  /// Hyper-parameters that do not change the plan, over the spec's: learning rate and Adam
  /// betas per optimizer group ("" for every group), interval per phase.
  std::map<std::string, double> lr;
  std::map<std::string, std::pair<double, double>> betas;
  std::map<std::string, int64_t> intervals;
  /// The training recipe over the spec's, re-planned in memory at start-up (no re-export):
  /// autocast precision per phase ("" for every phase: "float32", "bfloat16", "float16"),
  /// micro-batches per phase, gradient clipping per optimizer group (max norm, norm type;
  /// a max norm of 0 turns the group's clipping off), and G_ema's half-life in images (< 0:
  /// the spec's).
  std::map<std::string, std::string> precision;
  std::map<std::string, int64_t> accumulate;
  std::map<std::string, std::pair<double, double>> clip;
  double emaHalfLifeImages = -1;
  /// The batch per rank instead of the spec's (0: the spec's). The plan does not depend on
  /// it: used sets and buckets are the same at every batch.
  int64_t batchSize = 0;
  /// Rank 0 writes every all-reduced gradient and the final parameters here (parity tests).
  std::string dumpDir;
  /// Rank 0 writes the phases' timing here for `ganc simulate` (CPU ranks): per phase, the
  /// forward and backward seconds, when each bucket was ready, the optimizer's seconds.
  std::string profile;
  /// On CUDA: the last this many steps run under the CUDA profiler; timing.json's
  /// `kernel_time` says how long the GPU was busy in them (0: no trace).
  int64_t kernelTimeSteps = 0;
  /// With kernelTimeSteps: rank 0 writes the window's profiler trace here (Chrome trace JSON).
  std::string kernelTraceFile;
  std::string device = "cpu";
  /// The collectives' backend: "auto" (Gloo on CPU, NCCL on CUDA), "nccl" (CUDA only) or
  /// "gloo" (on CUDA too, eagerly: Gloo copies device tensors through the host, which a CUDA
  /// Graph cannot hold; several ranks may then share one GPU, cuda:LOCAL_RANK % GPUs).
  DistBackend distBackend = DistBackend::Auto;
  /// On CUDA: capture each phase once and replay it (false: run every phase eagerly).
  bool cudaGraphs = true;
  /// On CUDA, with cudaGraphs (--cuda-graphs step): once every phase a step runs is captured,
  /// launch them as one graph per step (the phase graphs as its child graphs).
  bool stepGraphs = false;
  /// Whether steps are launched as one graph: --dump-grads and --profile read each phase as
  /// it ends, so with them the phases replay one by one.
  bool launchesSteps() const {
    return cudaGraphs && stepGraphs && dumpDir.empty() && profile.empty();
  }
  /// With NCCL, where the gradient collectives run: "side" (NCCL's own stream, overlapping
  /// the rest of backward), "compute" (the compute stream, in order: a captured phase is one
  /// straight line of nodes) or "auto" (compute with one rank, where nothing overlaps; side
  /// with more).
  CommStream commStream = CommStream::Auto;
  /// On CUDA, with cudaGraphs: "kernel" (each captured memset node of up to 1 MiB becomes a
  /// kernel node writing the same bytes, which the GPU runs with less idle around it) or
  /// "keep" (the graphs as captured).
  GraphNodes memsetNodes = GraphNodes::Kernel;
  /// On CUDA, with cudaGraphs: "kernel" (each captured copy node between two places in the
  /// GPU's memory, up to 1 MiB, becomes a kernel node copying the same bytes) or "keep".
  GraphNodes copyNodes = GraphNodes::Kernel;
  /// On CUDA: where each data batch goes from its pinned host buffer to the GPU: "copy" (a
  /// stream of its own, beside the phases' kernels; the compute stream waits for it just
  /// before the batch is read) or "compute" (on the compute stream, in order).
  UploadStream uploadStream = UploadStream::Copy;
  /// On CUDA: eager iterations of each phase before its capture.
  int warmup = 3;
  /// On CUDA: deterministic cuDNN algorithms (and PyTorch's deterministic kernels), so
  /// that two runs, and ganc and eager PyTorch run the same way, agree bit for bit.
  bool deterministic = false;
  /// Layout of 4-D parameters, buffers and data: "contiguous" (NCHW), "channels_last"
  /// (NHWC, what cuDNN's tensor-core convolutions run on natively) or "auto" (channels-last
  /// on CUDA for models with convolutions, contiguous on CPU).
  MemoryFormat memoryFormat = MemoryFormat::Auto;
  /// In a phase that differentiates twice (torch.autograd.grad with create_graph: R1, path
  /// length, gradient penalties), its grouped convolutions run as ganc::convolution, whose
  /// double backward computes each gradient for every group in one call: those whose weight
  /// takes no gradient, bit for bit PyTorch's results ("filters"), or every one, to rounding
  /// ("grouped"); or they keep PyTorch's, which makes one convolution per group ("pytorch").
  /// The plan says which phases take it (their `double_backward`); see frontend/DoubleBackward.h.
  DoubleBackward doubleBackward = DoubleBackward::Filters;
  /// --executor: joint runs each phase's joint graph (ganc.export(joint=True)) through
  /// backend::JointProgram, on the CPU; torchscript the archive's methods under autograd; auto
  /// the joint graph of each phase whose plan holds one (on the CPU), TorchScript the rest.
  PhaseExecutor executor = PhaseExecutor::Auto;

  /// Whether `phase` runs its joint graph under this run's --executor (on CUDA with `cuda`).
  bool runsJoint(const ir::Phase &phase, bool cuda) const;
  /// On CUDA: cuDNN benchmark mode (algorithms timed during warm-up, before capture).
  /// Ignored with `deterministic`.
  bool cudnnBenchmark = true;
  /// How errors name the checkpoint resumed from: the flag that gave it.
  std::string resumeFlag = "--resume";
  /// Whether each phase's graph runs fused as its plan says (ganc::upfirdn2d, ganc::bias_act).
  Fusion fusion = Fusion::Auto;
  /// --fusion resolved for this run's device.
  bool fuses() const;
  int64_t steps = 1000;
  /// --steps was given (it and --kimg are one or the other).
  bool stepsGiven = false;
  /// --kimg: the run's length in thousands of real images (0: --steps gives it); set-up
  /// turns it into steps.
  double kimg = 0;
  /// --tick-kimg: a tick in thousands of real images (StyleGAN's --tick); set-up turns it into
  /// logEvery (the steps that reach it). --snap: the sample grid and a checkpoint every this
  /// many ticks (StyleGAN's --snap), set-up's sampleEvery and checkpointEvery. 0: not given.
  double tickKimg = 0;
  int64_t snap = 0;
  int64_t logEvery = 50;
  int64_t sampleEvery = 500;
  int64_t checkpointEvery = 1000;
  /// The interval flags the command line gave ("--log-every", "--sample-every",
  /// "--checkpoint-every"): --tick-kimg and --snap refuse to replace one.
  std::vector<std::string> intervalsGiven;
  int64_t samples = 64;
  /// Quality metrics (fidN, kidN, with _full: against the whole data set) computed every
  /// metricsEveryKimg thousand images (0: at the end only) and at the end, with the feature
  /// network at `inception` ("": defaultInceptionPath()).
  std::vector<std::string> metrics;
  double metricsEveryKimg = 0;
  std::string inception;
  uint64_t seed = 0;
  int timeoutSeconds = 120;
  /// A non-finite loss or gradient in a phase without a loss scaler: "stop" training, or
  /// "skip" the optimizer step and count it; "" takes the spec's `non_finite`.
  std::string nonFinite;
  /// Sharded optimizer state stage instead of the plan's: 0, 1 or 2 (-1: the plan's).
  int zero = -1;
  int threads = 0; // 0: cores / local ranks
  /// The record of these options that run.json keeps ("options"): the command's option table
  /// records each option it declares recorded (its record column); none where unset.
  std::function<nlohmann::json(const TrainOptions &)> record;
};

} // namespace ganc::runtime
