// `ganc train` and `ganc run`: their options, parsed into the runtime's TrainOptions.
#include "tools/TrainCommands.h"

#include "ir/TextFormat.h"
#include "runtime/Launcher.h"
#include "runtime/Trainer.h"

#include <algorithm>
#include <c10/util/Logging.h>

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

const char *kTrainUsage = R"(usage: ganc train PLAN --model MODEL.pt [options]
       ganc run --nproc N PLAN --model MODEL.pt [options]

  --model PATH            the archive PLAN was compiled from (checked)
  --op-library LIB.so     a TORCH_LIBRARY operator library the archive's code calls (the
                          archive names the ones it needs); repeat it or list with commas
  --data PATH             torch.save tensor file [N, *data.shape] in [-1, 1], or a folder of
                          PNG/JPEG images (resized to the spec's data shape)
  --steps N               training steps (default 1000); a phase runs when step % interval == 0
  --out DIR               the run's directory (default ganc-out): samples, stats.jsonl,
                          TensorBoard events, checkpoints, run.json (options and effective
                          spec); one that holds a run is refused without --resume or --force
  --force                 start over in an --out that holds a run (its files are removed;
                          checkpoint.pt stays until the new run writes one)
  --seed S                data order and noise seed (rank r draws noise from seed + r)
  --log-every N           progress line every N steps (default 50)
  --sample-every N        sample grid every N steps and at the end (default 500, 0: never)
  --checkpoint-every N    checkpoint every N steps and at the end (default 1000, 0: never)
  --keep-checkpoints N    step checkpoints (checkpoint-STEP.pt) kept besides checkpoint.pt,
                          the latest (default 3, 0: checkpoint.pt only)
  --samples N             images in the sample grid (default 64, at most 1024)
  --resume CKPT|auto      continue exactly from a checkpoint; auto: from --out's latest one,
                          or from step 0 if it has none (for restarted torchrun workers)
  --tensorboard on|off    TensorBoard event files in --out, written beside the run by
                          python -m ganc.tensorboard (default on)
  --lr [GROUP=]X          learning rate of every optimizer group, or of GROUP (repeatable)
  --betas [GROUP=]B1,B2   Adam betas of every Adam group, or of GROUP (repeatable)
  --interval PHASE=K      run PHASE every K steps instead of the spec's interval (repeatable)
  --precision [PHASE=]P   autocast every phase's (or PHASE's) forward to P: float32,
                          bfloat16 or float16, instead of the spec's (repeatable)
  --accumulate PHASE=K    PHASE takes K micro-batches per step (1 to 4096; repeatable)
  --clip GROUP=MAX[,TYPE] clip GROUP's all-reduced gradients to a TYPE-norm (default 2, a
                          number >= 1 or inf) of MAX (0: no clipping; repeatable)
  --ema-half-life-images N  G_ema's half-life in images instead of the spec's (0: beta 0)
  --batch-size N          batch per rank instead of the spec's
  --device cpu|cuda       cpu: Gloo; cuda: NCCL, one GPU per rank (cuda:LOCAL_RANK), each
                          phase captured once as a CUDA Graph and replayed
  --dist-backend auto|nccl|gloo
                          collectives: auto is Gloo on CPU, NCCL on CUDA; gloo on CUDA runs
                          eagerly (--cuda-graphs off) and lets ranks share a GPU
                          (cuda:LOCAL_RANK % GPUs), to debug several ranks on one GPU
  --cuda-graphs on|off|step
                          on: capture each phase and replay it (default); step: also launch
                          each step's phases as one graph once all are captured; off: run
                          every phase eagerly on the GPU
  --comm-stream auto|side|compute
                          NCCL: run the gradient collectives on NCCL's own stream,
                          overlapping backward (side), or in order on the compute stream,
                          which makes each captured phase one straight line of nodes
                          (compute); auto: compute with one rank, side with more
  --memset-nodes kernel|keep
                          CUDA Graphs: each captured memset node (up to 1 MiB) becomes a
                          kernel node writing the same bytes, which the GPU starts with less
                          idle around it (kernel, the default), or the graphs stay as
                          captured (keep)
  --copy-nodes kernel|keep
                          CUDA Graphs: likewise each captured copy between two places in
                          the GPU's memory (up to 1 MiB) becomes a kernel node (kernel, the
                          default), or stays a copy node (keep)
  --upload-stream copy|compute
                          CUDA: each data batch goes from its pinned host buffer to the GPU
                          on a stream of its own, beside the queued phases (copy, the
                          default), or in order on the compute stream (compute)
  --warmup N              eager iterations of each phase before its capture (default 3,
                          at least 1: optimizer state is created there, outside the graph)
  --deterministic         CUDA: deterministic cuDNN and PyTorch kernels, no cuDNN benchmark
                          (bitwise-reproducible runs; what the GPU parity tests use)
  --cudnn-benchmark on|off  CUDA: time cuDNN algorithms during warm-up (default on)
  --memory-format auto|channels_last|contiguous
                          layout of 4-D weights, buffers and data (default auto:
                          channels_last on CUDA, contiguous on CPU)
  --timeout-s S           give up on a silent peer after S seconds (default 120)
  --non-finite stop|skip  a non-finite loss or gradient (phases without a loss scaler): stop
                          with exit 1, or skip the optimizer step and count it (default: the
                          spec's non_finite, else stop)
  --zero 0|1|2            sharded optimizer state instead of the plan's (spec's) stage:
                          1 shards optimizer state, 2 gradients as well, 0 off
  --threads N             intra-op threads per rank (default: cores / local ranks)
  --dump-grads DIR        rank 0 writes every all-reduced gradient (parity tests)
  --profile FILE          rank 0 writes each phase's timing (compute, when each bucket was
                          ready, the optimizer) for `ganc simulate` (CPU ranks)
  --kernel-time N         CUDA: the last N steps run under the CUDA profiler; timing.json's
                          kernel_time holds how long the GPU was busy in them (the union of
                          its kernels, copies and memsets) and their wall time
  --kernel-trace FILE     with --kernel-time: rank 0 writes that window's trace here (Chrome
                          trace JSON, for Perfetto or chrome://tracing)
ranks come from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun's contract).
)";

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

/// Reads an option's value off the command line, checked.
class ArgReader {
public:
  explicit ArgReader(const std::vector<std::string> &args) : args_(args) {}
  bool done() const { return next_ >= args_.size(); }
  const std::string &next() { return args_[next_++]; }
  std::string value(const std::string &flag) {
    if (done())
      throw std::invalid_argument(flag + " needs a value");
    return next();
  }
  /// An integer from `minimum` to `maximum`.
  int64_t number(const std::string &flag, int64_t maximum = std::numeric_limits<int64_t>::max(),
                 int64_t minimum = 0) {
    std::string v = value(flag);
    size_t used = 0;
    int64_t n = -1;
    try {
      n = std::stoll(v, &used);
    } catch (const std::exception &) {
    }
    if (used != v.size() || n < minimum || n > maximum)
      throw std::invalid_argument(flag + " takes an integer from " + std::to_string(minimum) +
                                  " to " + std::to_string(maximum) + ", not '" + v + "'");
    return n;
  }
  /// "KEY=VALUE" as (KEY, VALUE); a value without "KEY=" as ("", VALUE).
  std::pair<std::string, std::string> keyed(const std::string &flag) {
    std::string v = value(flag);
    size_t eq = v.find('=');
    if (eq == std::string::npos)
      return {"", v};
    return {v.substr(0, eq), v.substr(eq + 1)};
  }
  /// A finite real number in [low, high) (a "for FLAG" error otherwise).
  static double real(const std::string &flag, const std::string &text, double low, double high) {
    std::optional<double> v = ir::parseDouble(text);
    if (!v || !(*v >= low) || !(*v < high))
      throw std::invalid_argument(flag + " takes a number in [" + ir::formatDouble(low) + ", " +
                                  ir::formatDouble(high) + "), not '" + text + "'");
    return *v;
  }
  /// One of `allowed` ("a, b or c" in the error).
  std::string choice(const std::string &flag, const std::vector<std::string> &allowed) {
    std::string v = value(flag);
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end())
      return v;
    std::string list;
    for (size_t k = 0; k < allowed.size(); ++k)
      list += (k == 0 ? "" : k + 1 == allowed.size() ? " or " : ", ") + allowed[k];
    throw std::invalid_argument(flag + " takes " + list + ", not '" + v + "'");
  }

private:
  const std::vector<std::string> &args_;
  size_t next_ = 0;
};

using OptionHandler = std::function<void(ArgReader &, const std::string &, TrainOptions &)>;

/// Every training option: what its value sets.
const std::map<std::string, OptionHandler> &trainOptions() {
  using R = ArgReader;
  using S = const std::string;
  using O = TrainOptions;
  static const std::map<std::string, OptionHandler> options = {
      {"--model", [](R &r, S &f, O &o) { o.model = r.value(f); }},
      {"--op-library",
       [](R &r, S &f, O &o) {
         for (std::string &library : ir::splitList(r.value(f)))
           o.opLibraries.push_back(std::move(library));
       }},
      {"--data", [](R &r, S &f, O &o) { o.data = r.value(f); }},
      {"--steps", [](R &r, S &f, O &o) { o.steps = r.number(f); }},
      {"--out", [](R &r, S &f, O &o) { o.outDir = r.value(f); }},
      {"--seed", [](R &r, S &f, O &o) { o.seed = static_cast<uint64_t>(r.number(f)); }},
      {"--log-every",
       [](R &r, S &f, O &o) { o.logEvery = r.number(f, std::numeric_limits<int64_t>::max(), 1); }},
      {"--sample-every", [](R &r, S &f, O &o) { o.sampleEvery = r.number(f); }},
      {"--checkpoint-every", [](R &r, S &f, O &o) { o.checkpointEvery = r.number(f); }},
      // The grid is one forward of the generator: 32 x 32 images at most (a typo of 200000
      // took 23 GB of host memory and four minutes, and wrote a 380 MB PNG).
      {"--samples", [](R &r, S &f, O &o) { o.samples = r.number(f, 1024, 1); }},
      {"--resume", [](R &r, S &f, O &o) { o.resume = r.value(f); }},
      {"--device", [](R &r, S &f, O &o) { o.device = r.value(f); }},
      {"--dist-backend",
       [](R &r, S &f, O &o) {
         o.distBackend = r.choice(f, {"auto", "nccl", "gloo"});
       }},
      {"--cuda-graphs",
       [](R &r, S &f, O &o) {
         const std::string mode = r.choice(f, {"on", "off", "step"});
         o.cudaGraphs = mode != "off";
         o.stepGraphs = mode == "step";
       }},
      {"--comm-stream",
       [](R &r, S &f, O &o) {
         o.commStream = r.choice(f, {"auto", "side", "compute"});
       }},
      {"--memset-nodes",
       [](R &r, S &f, O &o) {
         o.memsetNodes = r.choice(f, {"kernel", "keep"});
       }},
      {"--copy-nodes",
       [](R &r, S &f, O &o) {
         o.copyNodes = r.choice(f, {"kernel", "keep"});
       }},
      {"--upload-stream",
       [](R &r, S &f, O &o) {
         o.uploadStream = r.choice(f, {"copy", "compute"});
       }},
      {"--warmup", [](R &r, S &f, O &o) { o.warmup = static_cast<int>(r.number(f, 1000000)); }},
      {"--memory-format",
       [](R &r, S &f, O &o) {
         o.memoryFormat = r.choice(f, {"auto", "channels_last", "contiguous"});
       }},
      {"--deterministic", [](R &, S &, O &o) { o.deterministic = true; }},
      {"--cudnn-benchmark",
       [](R &r, S &f, O &o) {
         o.cudnnBenchmark = r.choice(f, {"on", "off"}) == "on";
       }},
      {"--timeout-s",
       [](R &r, S &f, O &o) {
         o.timeoutSeconds = static_cast<int>(r.number(f, 1000000000, 1));
       }},
      {"--threads", [](R &r, S &f, O &o) { o.threads = static_cast<int>(r.number(f, 4096, 1)); }},
      {"--zero",
       [](R &r, S &f, O &o) {
         o.zero = std::stoi(r.choice(f, {"0", "1", "2"}));
       }},
      {"--non-finite",
       [](R &r, S &f, O &o) {
         o.nonFinite = r.choice(f, {"stop", "skip"});
       }},
      {"--dump-grads", [](R &r, S &f, O &o) { o.dumpDir = r.value(f); }},
      {"--profile", [](R &r, S &f, O &o) { o.profile = r.value(f); }},
      {"--kernel-time",
       [](R &r, S &f, O &o) {
         o.kernelTimeSteps = r.number(f, std::numeric_limits<int64_t>::max(), 1);
       }},
      {"--kernel-trace", [](R &r, S &f, O &o) { o.kernelTraceFile = r.value(f); }},
      {"--force", [](R &, S &, O &o) { o.force = true; }},
      {"--batch-size",
       [](R &r, S &f, O &o) {
         o.batchSize = r.number(f, 1 << 24, 1);
       }},
      {"--keep-checkpoints", [](R &r, S &f, O &o) { o.keepCheckpoints = r.number(f, 1000000); }},
      {"--tensorboard",
       [](R &r, S &f, O &o) {
         o.tensorboard = r.choice(f, {"on", "off"}) == "on";
       }},
      {"--lr",
       [](R &r, S &f, O &o) {
         auto [group, text] = r.keyed(f);
         o.lr[group] = R::real(f, text, 0, 1e6);
         if (o.lr[group] <= 0)
           throw std::invalid_argument(f + " must be positive, not '" + text + "'");
       }},
      {"--betas",
       [](R &r, S &f, O &o) {
         auto [group, text] = r.keyed(f);
         size_t comma = text.find(',');
         if (comma == std::string::npos)
           throw std::invalid_argument(f + " takes B1,B2 (e.g. 0,0.99), not '" + text + "'");
         o.betas[group] = {R::real(f, text.substr(0, comma), 0, 1),
                           R::real(f, text.substr(comma + 1), 0, 1)};
       }},
      {"--precision",
       [](R &r, S &f, O &o) {
         auto [phase, text] = r.keyed(f);
         if (text != "float32" && text != "bfloat16" && text != "float16")
           throw std::invalid_argument(f + " takes [PHASE=]float32, bfloat16 or float16, not '" +
                                       text + "'");
         o.precision[phase] = text;
       }},
      {"--accumulate",
       [](R &r, S &f, O &o) {
         auto [phase, text] = r.keyed(f);
         std::optional<int64_t> k = ir::parseInt64(text);
         if (phase.empty() || !k || *k < 1 || *k > 4096)
           throw std::invalid_argument(f + " takes PHASE=K with K from 1 to 4096 (e.g. Dmain=2), not '" +
                                       (phase.empty() ? text : phase + "=" + text) + "'");
         o.accumulate[phase] = *k;
       }},
      {"--clip",
       [](R &r, S &f, O &o) {
         auto [group, text] = r.keyed(f);
         if (group.empty())
           throw std::invalid_argument(f + " takes GROUP=MAX_NORM[,TYPE] (e.g. generator=1.0), not '" +
                                       text + "'");
         size_t comma = text.find(',');
         double maxNorm = R::real(f, text.substr(0, comma), 0, 1e12);
         double type = 2.0;
         if (comma != std::string::npos) {
           std::string t = text.substr(comma + 1);
           type = t == "inf" ? std::numeric_limits<double>::infinity() : R::real(f, t, 1, 1e6);
         }
         o.clip[group] = {maxNorm, type};
       }},
      {"--ema-half-life-images",
       [](R &r, S &f, O &o) { o.emaHalfLifeImages = R::real(f, r.value(f), 0, 1e15); }},
      {"--interval",
       [](R &r, S &f, O &o) {
         auto [phase, text] = r.keyed(f);
         if (phase.empty())
           throw std::invalid_argument(f + " takes PHASE=K (e.g. d_reg=16), not '" + text + "'");
         std::optional<double> k = ir::parseDouble(text);
         if (!k || *k < 1 || *k > 1e9 || *k != static_cast<double>(static_cast<int64_t>(*k)))
           throw std::invalid_argument(f + " " + phase +
                                       "= takes a whole number of steps >= 1, "
                                       "not '" +
                                       text + "'");
         o.intervals[phase] = static_cast<int64_t>(*k);
       }},
  };
  return options;
}

bool parseTrain(const std::vector<std::string> &args, TrainOptions &o, std::string &error) {
  ArgReader reader(args);
  while (!reader.done()) {
    const std::string &a = reader.next();
    auto option = trainOptions().find(a);
    try {
      if (option != trainOptions().end()) {
        option->second(reader, a, o);
      } else if (!a.empty() && a[0] == '-') {
        error = "unknown option '" + a + "' (see ganc train --help)";
        return false;
      } else if (o.plan.empty()) {
        o.plan = a;
      } else {
        error = "unexpected argument '" + a + "'";
        return false;
      }
    } catch (const std::exception &e) {
      error = e.what();
      return false;
    }
  }
  if (o.plan.empty()) {
    error = "no PLAN given (ganc train PLAN --model MODEL.pt)";
    return false;
  }
  if (o.model.empty()) {
    error = "no --model given: the archive the plan was compiled from";
    return false;
  }
  if (o.force && !o.resume.empty()) {
    error = "--force starts over and --resume continues: give one of them";
    return false;
  }
  if (o.distBackend == "nccl" && o.device != "cuda") {
    error = "--dist-backend nccl needs --device cuda: NCCL runs on GPUs (CPU ranks use Gloo)";
    return false;
  }
  if (o.distBackend == "gloo" && o.device == "cuda" && o.cudaGraphs) {
    error = "--dist-backend gloo on CUDA needs --cuda-graphs off: Gloo copies device tensors "
            "through the host, which a captured CUDA Graph cannot hold";
    return false;
  }
  if (o.commStream != "auto" && (o.device != "cuda" || o.distBackend == "gloo")) {
    error = "--comm-stream " + o.commStream +
            " places NCCL's collectives on a CUDA stream: it needs --device cuda with NCCL "
            "(Gloo runs collectives on its own threads)";
    return false;
  }
  for (const auto &[flag, value] :
       {std::pair<const char *, const std::string &>{"--memset-nodes", o.memsetNodes},
        {"--copy-nodes", o.copyNodes}})
    if (value != "kernel" && (o.device != "cuda" || !o.cudaGraphs)) {
      error = std::string(flag) + " " + value +
              " changes captured CUDA Graphs: it needs --device cuda with --cuda-graphs on or step";
      return false;
    }
  if (o.uploadStream != "copy" && o.device != "cuda") {
    error = "--upload-stream " + o.uploadStream +
            " places the data batch's host-to-device copy on a CUDA stream: it needs --device cuda";
    return false;
  }
  if (!o.kernelTraceFile.empty() && o.kernelTimeSteps == 0) {
    error = "--kernel-trace FILE writes the --kernel-time window's trace: give --kernel-time N too";
    return false;
  }
  if (o.kernelTimeSteps > 0 && o.device != "cuda") {
    error = "--kernel-time traces GPU kernels: it needs --device cuda";
    return false;
  }
  if (o.device == "cuda" && o.cudaGraphs && o.warmup < 1) {
    error = "--warmup must be at least 1 with CUDA Graphs: optimizer state is created in the "
            "eager warm-up, outside the captured graph";
    return false;
  }
  return true;
}

bool wantsHelp(const std::vector<std::string> &args) {
  for (const std::string &a : args)
    if (a == "-h" || a == "--help")
      return true;
  return false;
}

} // namespace

int trainCommand(const std::vector<std::string> &args) {
  if (wantsHelp(args)) {
    std::cout << kTrainUsage;
    return 0;
  }
  TrainOptions options;
  std::string error;
  if (!parseTrain(args, options, error))
    return usageError("train: " + error);
  // c10d logs every failed rendezvous attempt with a stack trace; ganc reports the failure
  // in one line. PyTorch's own TORCH_CPP_LOG_LEVEL brings those logs back.
  if (!std::getenv("TORCH_CPP_LOG_LEVEL"))
    FLAGS_caffe2_log_level = 3; // FATAL only
  Status status = runtime::train(options);
  if (!status)
    reportError(status.message());
  return status.exitCode();
}

int runCommand(const std::string &self, const std::vector<std::string> &args) {
  if (wantsHelp(args)) {
    std::cout << kTrainUsage;
    return 0;
  }
  std::optional<int64_t> nproc;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc" && i + 1 < args.size())
      nproc = ir::parseInt64(args[++i]);
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
  std::string error;
  if (!parseTrain(rest, check, error))
    return usageError("run: " + error);

  return runtime::launchLocalRanks(self, static_cast<int>(*nproc), rest);
}

} // namespace ganc::tools
