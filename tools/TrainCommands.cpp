// `ganc train` and `ganc run`: their options, parsed into the runtime's TrainOptions.
#include "tools/TrainCommands.h"

#include "runtime/Launcher.h"
#include "runtime/Trainer.h"

#include <iostream>

namespace ganc::tools {

using runtime::TrainOptions;

namespace {

const char *kTrainUsage = R"(usage: ganc train PLAN --model MODEL.pt [options]
       ganc run --nproc N PLAN --model MODEL.pt [options]

  --model PATH            the archive PLAN was compiled from (checked)
  --data PATH             torch.save tensor file [N, *data.shape] in [-1, 1], or a folder of
                          PNG/JPEG images (resized to the spec's data shape)
  --steps N               training steps (default 1000); a phase runs when step % interval == 0
  --out DIR               samples, loss_history.csv, checkpoint.pt (default ganc-out)
  --seed S                data order and noise seed (rank r draws noise from seed + r)
  --log-every N           progress line every N steps (default 50)
  --sample-every N        sample grid every N steps and at the end (default 500, 0: never)
  --checkpoint-every N    checkpoint every N steps and at the end (default 1000, 0: never)
  --samples N             images in the sample grid (default 64)
  --resume CKPT           continue exactly from a checkpoint
  --device cpu|cuda       cpu: Gloo; cuda: NCCL, one GPU per rank (cuda:LOCAL_RANK), each
                          phase captured once as a CUDA Graph and replayed
  --cuda-graphs on|off    off: run every phase eagerly on the GPU (default on)
  --warmup N              eager iterations of each phase before its capture (default 3,
                          at least 1: optimizer state is created there, outside the graph)
  --deterministic         CUDA: deterministic cuDNN and PyTorch kernels, no cuDNN benchmark
                          (bitwise-reproducible runs; what the GPU parity tests use)
  --cudnn-benchmark on|off  CUDA: time cuDNN algorithms during warm-up (default on)
  --memory-format auto|channels_last|contiguous
                          layout of 4-D weights, buffers and data (default auto:
                          channels_last on CUDA, contiguous on CPU)
  --timeout-s S           give up on a silent peer after S seconds (default 120)
  --threads N             intra-op threads per rank (default: cores / local ranks)
  --dump-grads DIR        rank 0 writes every all-reduced gradient (parity tests)
ranks come from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun's contract).
)";

int usageError(const std::string &message) {
  std::cerr << "ganc: error: " << message << "\n";
  return 2;
}

bool parseTrain(const std::vector<std::string> &args, TrainOptions &o, std::string &error) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size())
        throw std::invalid_argument(a + " needs a value");
      return args[++i];
    };
    auto number = [&]() -> int64_t {
      std::string v = value();
      size_t used = 0;
      int64_t n = std::stoll(v, &used);
      if (used != v.size() || n < 0)
        throw std::invalid_argument(a + " takes a non-negative integer, not '" + v + "'");
      return n;
    };
    try {
      if (a == "--model")
        o.model = value();
      else if (a == "--data")
        o.data = value();
      else if (a == "--steps")
        o.steps = number();
      else if (a == "--out")
        o.outDir = value();
      else if (a == "--seed")
        o.seed = static_cast<uint64_t>(number());
      else if (a == "--log-every")
        o.logEvery = std::max<int64_t>(1, number());
      else if (a == "--sample-every")
        o.sampleEvery = number();
      else if (a == "--checkpoint-every")
        o.checkpointEvery = number();
      else if (a == "--samples")
        o.samples = std::max<int64_t>(1, number());
      else if (a == "--resume")
        o.resume = value();
      else if (a == "--device")
        o.device = value();
      else if (a == "--cuda-graphs") {
        std::string v = value();
        if (v != "on" && v != "off")
          throw std::invalid_argument("--cuda-graphs takes on or off, not '" + v + "'");
        o.cudaGraphs = v == "on";
      } else if (a == "--warmup")
        o.warmup = static_cast<int>(number());
      else if (a == "--memory-format") {
        std::string v = value();
        if (v != "auto" && v != "channels_last" && v != "contiguous")
          throw std::invalid_argument(
              "--memory-format takes auto, channels_last or contiguous, not '" + v + "'");
        o.memoryFormat = v;
      } else if (a == "--deterministic")
        o.deterministic = true;
      else if (a == "--cudnn-benchmark") {
        std::string v = value();
        if (v != "on" && v != "off")
          throw std::invalid_argument("--cudnn-benchmark takes on or off, not '" + v + "'");
        o.cudnnBenchmark = v == "on";
      } else if (a == "--timeout-s")
        o.timeoutSeconds = static_cast<int>(std::max<int64_t>(1, number()));
      else if (a == "--threads")
        o.threads = static_cast<int>(number());
      else if (a == "--dump-grads")
        o.dumpDir = value();
      else if (!a.empty() && a[0] == '-') {
        error = "unknown option '" + a + "' (see ganc train --help)";
        return false;
      } else if (o.plan.empty())
        o.plan = a;
      else {
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
  Status status = runtime::train(options);
  if (!status)
    std::cerr << "ganc: error: " << status.message() << std::endl;
  return status.exitCode();
}

int runCommand(const std::string &self, const std::vector<std::string> &args) {
  if (wantsHelp(args)) {
    std::cout << kTrainUsage;
    return 0;
  }
  int nproc = 0;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc" && i + 1 < args.size()) {
      try {
        nproc = std::stoi(args[++i]);
      } catch (const std::exception &) {
        nproc = 0;
      }
    } else {
      rest.push_back(args[i]);
    }
  }
  if (nproc < 1)
    return usageError("run: --nproc N (N >= 1) says how many local ranks to start");
  TrainOptions check;
  std::string error;
  if (!parseTrain(rest, check, error))
    return usageError("run: " + error);

  return runtime::launchLocalRanks(self, nproc, rest);
}

} // namespace ganc::tools
