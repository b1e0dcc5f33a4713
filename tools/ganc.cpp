// ganc: the command-line driver (compile, explain, train, run).
#include "frontend/Frontend.h"
#include "ir/Files.h"
#include "ir/TextFormat.h"
#include "passes/Pass.h"
#include "tools/Autotune.h"
#include "tools/CommModel.h"
#include "tools/Report.h"
#include "tools/Simulate.h"
#include "tools/TrainCommands.h"

#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unistd.h>

using namespace ganc;

namespace {

const char *kUsage = R"(usage: ganc <command> [options]

commands:
  compile MODEL.pt -o PLAN [--bucket-cap-mb N|auto] [--first-bucket-mb N] [--zero 0|1|2]
                            [--ranks N] [--emit ir|json|report] [--print-ir-after PASS]
                            [--op-library LIB.so ...]
                            [--target-gpus N --profile TIMING.json [--link ib|...]
                             [--intra-link L] [--ranks-per-host N] [--alpha-us A]
                             [--bandwidth-gbps B]]
      lower every phase of a TorchScript GAN archive (with its ganc.json spec) to the ganc IR,
      find the parameters each phase trains, bucket their all-reduces, and write the plan.
      --zero shards optimizer state (stage 1) and gradients (2), the spec's `zero` otherwise;
      --ranks N lays the shards out for N ranks (a run on another world size re-plans them).
      --bucket-cap-mb auto picks each phase's caps that leave the least communication exposed
      at --target-gpus ranks, simulated from a `ganc train --profile` run on the links the
      link options describe (as ganc simulate's).
      --op-library loads a TORCH_LIBRARY operator library the archive's code calls (it was
      exported with ganc.export(..., op_libraries=[...])); repeat it or list them with commas.
  explain PLAN [--json]
      per phase: used and unused parameters, buckets, all-reduce order and bytes per step.
  train PLAN --model MODEL.pt [options]     one rank; reads RANK, WORLD_SIZE, LOCAL_RANK,
                                            MASTER_ADDR, MASTER_PORT like torchrun
  run --nproc N PLAN --model MODEL.pt [options]
                                            start N local ranks of `ganc train`
  plot OUT [-o PNG]                         a run's loss curves as a PNG (Python, matplotlib)
  simulate PLAN --profile TIMING.json --gpus 1,8,64 [--link ib|...]
      predicted step time, exposed communication and scaling efficiency per world size, from
      a `ganc train --profile` run and an alpha-beta model of ring and tree all-reduce.
  (ganc COMMAND --help lists each command's options; ganc --version says which ganc)

exit codes: 0 success, 2 bad input (one line on stderr says which file/phase/parameter),
            1 a rank failed during training.
)";

int fail(const std::string &message) {
  std::cerr << "ganc: error: " << message << "\n";
  return 2;
}

struct CompileArgs {
  std::string model, output, emit, printAfter;
  /// --op-library: operator libraries to load before the archive.
  std::vector<std::string> opLibraries;
  /// --bucket-cap-mb auto: tune each phase's caps for --target-gpus from --profile.
  bool autotune = false;
  tools::AutotuneOptions tune;
  bool tuneLinks = false; // a link option was given
  passes::PipelineOptions options;
  bool help = false;
};

/// Reads `ganc compile`'s command line and checks it; errors are one line for fail().
Status parseCompileArgs(const std::vector<std::string> &args, CompileArgs &c) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    auto value = [&](const char *flag) -> std::string {
      if (i + 1 >= args.size())
        throw std::runtime_error(std::string(flag) + " needs a value");
      return args[++i];
    };
    auto megabytes = [&](const char *flag) {
      const std::string text = value(flag);
      const std::optional<double> mib = ir::parseDouble(text);
      if (!mib || !(*mib > 0) || *mib >= 1048576)
        throw std::runtime_error(std::string(flag) +
                                 " takes a number of MiB in (0, 1048576), not '" + text + "'");
      return static_cast<int64_t>(*mib * 1048576);
    };
    auto integer = [&](const char *flag, int64_t low, int64_t high, const char *meaning) {
      const std::string text = value(flag);
      const std::optional<int64_t> n = ir::parseInt64(text);
      if (!n || *n < low || *n > high)
        throw std::runtime_error(std::string(flag) + " takes " + meaning + ", not '" + text + "'");
      return *n;
    };
    try {
      if (a == "-o" || a == "--output")
        c.output = value("-o");
      else if (a == "--bucket-cap-mb" && i + 1 < args.size() && args[i + 1] == "auto")
        c.autotune = (++i, true);
      else if (a == "--bucket-cap-mb")
        c.options.pass.bucketCapBytes = megabytes("--bucket-cap-mb");
      else if (a == "--target-gpus")
        c.tune.ranks = integer("--target-gpus", 1, 1 << 24, "the world size to tune buckets for");
      else if (a == "--profile")
        c.tune.profile = value("--profile");
      else if (auto topology = tools::parseTopologyOption(args, i, c.tune.topology); !topology)
        return topology.status();
      else if (*topology)
        c.tuneLinks = true;
      else if (a == "--first-bucket-mb")
        c.options.pass.firstBucketCapBytes = megabytes("--first-bucket-mb");
      else if (a == "--zero")
        c.options.pass.zeroStage = static_cast<int>(
            integer("--zero", 0, 2, "0 (off), 1 (shard optimizer state) or 2 (and gradients)"));
      else if (a == "--ranks")
        c.options.pass.ranks = integer("--ranks", 1, 1 << 20, "the world size to plan shards for");
      else if (a == "--emit")
        c.emit = value("--emit");
      else if (a == "--op-library")
        for (std::string &library : ir::splitList(value("--op-library")))
          c.opLibraries.push_back(std::move(library));
      else if (a == "--print-ir-after")
        c.printAfter = value("--print-ir-after");
      else if (a == "-h" || a == "--help")
        c.help = true;
      else if (!a.empty() && a[0] == '-')
        return Status::error("unknown option '" + a + "'");
      else if (c.model.empty())
        c.model = a;
      else
        return Status::error("more than one model given ('" + c.model + "', '" + a + "')");
    } catch (const std::exception &e) {
      return Status::error(e.what());
    }
  }
  if (c.help)
    return Status::ok();
  if (c.model.empty())
    return Status::error("no MODEL.pt given (ganc compile MODEL.pt -o PLAN)");
  if (c.output.empty() && c.emit.empty())
    return Status::error("say where the plan goes with -o PLAN");
  if (!c.emit.empty() && c.emit != "ir" && c.emit != "json" && c.emit != "report")
    return Status::error("--emit takes ir, json or report, not '" + c.emit + "'");
  if (c.options.pass.bucketCapBytes <= 0 || c.options.pass.firstBucketCapBytes <= 0)
    return Status::error("bucket caps must be positive");
  if (c.autotune && (c.tune.ranks == 0 || c.tune.profile.empty()))
    return Status::error("--bucket-cap-mb auto needs --target-gpus N and --profile TIMING.json "
                         "(from ganc train --profile)");
  if (!c.autotune && (c.tune.ranks || !c.tune.profile.empty()))
    return Status::error("--target-gpus and --profile tune buckets: add --bucket-cap-mb auto");
  if (!c.autotune && c.tuneLinks)
    return Status::error("--link, --intra-link, --ranks-per-host, --alpha-us and "
                         "--bandwidth-gbps describe the links buckets are tuned for: add "
                         "--bucket-cap-mb auto");
  if (!c.printAfter.empty() && !passes::findPass(c.printAfter))
    return Status::error("--print-ir-after names unknown pass '" + c.printAfter + "'");
  if (!c.output.empty()) {
    // The plan may replace an earlier plan, never the model or anything that is not a file.
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::exists(c.output, ec) && fs::equivalent(c.output, c.model, ec))
      return Status::error("-o " + c.output + " is the model archive itself");
    if (fs::exists(c.output, ec) && !fs::is_regular_file(c.output, ec))
      return Status::error("-o " + c.output + " exists and is not a regular file");
  }
  return Status::ok();
}

int compile(const std::vector<std::string> &args) {
  CompileArgs c;
  if (Status s = parseCompileArgs(args, c); !s)
    return fail("compile: " + s.message());
  if (c.help) {
    std::cout << kUsage;
    return 0;
  }
  if (Status s = frontend::loadOpLibraries(c.opLibraries); !s)
    return fail("compile: " + s.message());
  auto archive = frontend::loadArchive(c.model);
  if (!archive)
    return fail(archive.status().message());
  auto module = frontend::lowerToIR(*archive);
  if (!module)
    return fail(module.status().message());
  if (!c.printAfter.empty())
    c.options.afterPass = [&](const std::string &name, const ir::Module &m) {
      if (name == c.printAfter)
        std::cout << "// IR after " << name << "\n" << ir::print(m);
    };
  Status status = ir::verify(**module).withContext("lowered IR is invalid");
  if (status)
    status = passes::runPipeline(**module, passes::defaultPipeline(), c.options);
  if (status && c.autotune)
    status = tools::autotuneBuckets(**module, c.tune, c.options);
  if (!status)
    return fail(status.inFile(c.model).message());
  std::string text = ir::print(**module);
  if (!c.output.empty()) {
    if (Status s = writeFileAtomically(c.output, ir::stampPlan(text)); !s)
      return fail(s.message());
    // One line for people; stdout stays the --emit output's alone.
    (c.emit.empty() ? std::cout : std::cerr) << tools::summary(**module, c.output) << "\n";
  }
  if (c.emit == "ir")
    std::cout << text;
  else if (c.emit == "json")
    std::cout << tools::planJson(**module);
  else if (c.emit == "report")
    std::cout << tools::explain(**module);
  return 0;
}

int explainCommand(std::vector<std::string> args) {
  if (args.size() == 1 && (args[0] == "-h" || args[0] == "--help")) {
    std::cout << "usage: ganc explain PLAN [--json]\n\n"
                 "Per phase: how it is replayed, the used, unused, conditional and frozen\n"
                 "parameters with sizes, the optimizer groups it steps, its training-step\n"
                 "features, and its buckets in all-reduce order with the bytes per step.\n"
                 "--json: the same plan as JSON (what compile --emit json prints).\n";
    return 0;
  }
  auto json = std::find(args.begin(), args.end(), "--json");
  const bool asJson = json != args.end();
  if (asJson)
    args.erase(json);
  if (args.size() != 1)
    return fail("explain: usage: ganc explain PLAN [--json]");
  auto plan = ir::readPlan(args[0]);
  if (!plan)
    return fail(plan.status().message());
  std::cout << (asJson ? tools::planJson(**plan) : tools::explain(**plan));
  return 0;
}

/// `ganc plot` is Python (matplotlib): run it with the Python ganc was installed into.
int plotCommand(const std::vector<std::string> &args) {
  const char *python = std::getenv("GANC_PYTHON");
  std::vector<std::string> command = {python && *python ? python : GANC_DEFAULT_PYTHON, "-m",
                                      "ganc.plot"};
  command.insert(command.end(), args.begin(), args.end());
  std::vector<char *> argv;
  for (std::string &a : command)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  return fail(std::string("plot: cannot run ") + argv[0] +
              " (set GANC_PYTHON to the Python "
              "ganc is installed into)");
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "compile")
    return compile(args);
  if (command == "explain")
    return explainCommand(args);
  if (command == "plot")
    return plotCommand(args);
  if (command == "simulate")
    return tools::simulateCommand(args);
  if (command == "train")
    return tools::trainCommand(args);
  if (command == "run")
    return tools::runCommand(argv[0], args);
  if (command == "--version" || command == "version") {
#ifdef GANC_WITH_CUDA
    const char *cuda = "on";
#else
    const char *cuda = "off";
#endif
    std::cout << "ganc " << GANC_VERSION << " (LibTorch " << TORCH_VERSION << ", CUDA backend "
              << cuda << ")\n";
    return 0;
  }
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  return fail("unknown command '" + command + "' (see ganc --help)");
}
