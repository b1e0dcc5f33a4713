// ganc: the command-line driver (compile, explain, train, run).
#include "frontend/Frontend.h"
#include "ir/Files.h"
#include "passes/Pass.h"
#include "tools/Report.h"
#include "tools/TrainCommands.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

using namespace ganc;

namespace {

const char *kUsage = R"(usage: ganc <command> [options]

commands:
  compile MODEL.pt -o PLAN [--bucket-cap-mb N] [--first-bucket-mb N] [--emit ir|json|report]
                            [--print-ir-after PASS]
      lower every phase of a TorchScript GAN archive (with its ganc.json spec) to the ganc IR,
      find the parameters each phase trains, bucket their all-reduces, and write the plan.
  explain PLAN
      per phase: used and unused parameters, buckets, all-reduce order and bytes per step.
  train PLAN --model MODEL.pt [options]     one rank; reads RANK, WORLD_SIZE, LOCAL_RANK,
                                            MASTER_ADDR, MASTER_PORT like torchrun
  run --nproc N PLAN --model MODEL.pt [options]
                                            start N local ranks of `ganc train`
  (ganc train --help lists the training options)

exit codes: 0 success, 2 bad input (one line on stderr says which file/phase/parameter),
            1 a rank failed during training.
)";

int fail(const std::string &message) {
  std::cerr << "ganc: error: " << message << "\n";
  return 2;
}

int compile(const std::vector<std::string> &args) {
  std::string model, output, emit, printAfter;
  passes::PipelineOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    auto value = [&](const char *flag) -> std::string {
      if (i + 1 >= args.size())
        throw std::runtime_error(std::string(flag) + " needs a value");
      return args[++i];
    };
    try {
      if (a == "-o" || a == "--output")
        output = value("-o");
      else if (a == "--bucket-cap-mb")
        options.pass.bucketCapBytes =
            static_cast<int64_t>(std::stod(value("--bucket-cap-mb")) * 1048576);
      else if (a == "--first-bucket-mb")
        options.pass.firstBucketCapBytes =
            static_cast<int64_t>(std::stod(value("--first-bucket-mb")) * 1048576);
      else if (a == "--emit")
        emit = value("--emit");
      else if (a == "--print-ir-after")
        printAfter = value("--print-ir-after");
      else if (a == "-h" || a == "--help") {
        std::cout << kUsage;
        return 0;
      } else if (!a.empty() && a[0] == '-')
        return fail("compile: unknown option '" + a + "'");
      else if (model.empty())
        model = a;
      else
        return fail("compile: more than one model given ('" + model + "', '" + a + "')");
    } catch (const std::exception &e) {
      return fail(std::string("compile: ") + e.what());
    }
  }
  if (model.empty())
    return fail("compile: no MODEL.pt given (ganc compile MODEL.pt -o PLAN)");
  if (output.empty() && emit.empty())
    return fail("compile: say where the plan goes with -o PLAN");
  if (!emit.empty() && emit != "ir" && emit != "json" && emit != "report")
    return fail("compile: --emit takes ir, json or report, not '" + emit + "'");
  if (options.pass.bucketCapBytes <= 0 || options.pass.firstBucketCapBytes <= 0)
    return fail("compile: bucket caps must be positive");
  if (!printAfter.empty() && !passes::findPass(printAfter))
    return fail("compile: --print-ir-after names unknown pass '" + printAfter + "'");
  if (!output.empty()) {
    // The plan may replace an earlier plan, never the model or anything that is not a file.
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::exists(output, ec) && fs::equivalent(output, model, ec))
      return fail("compile: -o " + output + " is the model archive itself");
    if (fs::exists(output, ec) && !fs::is_regular_file(output, ec))
      return fail("compile: -o " + output + " exists and is not a regular file");
  }

  auto archive = frontend::loadArchive(model);
  if (!archive)
    return fail(archive.status().message());
  auto module = frontend::lowerToIR(*archive);
  if (!module)
    return fail(module.status().message());
  if (!printAfter.empty())
    options.afterPass = [&](const std::string &name, const ir::Module &m) {
      if (name == printAfter)
        std::cout << "// IR after " << name << "\n" << ir::print(m);
    };
  Status status = ir::verify(**module).withContext("lowered IR is invalid");
  if (status)
    status = passes::runPipeline(**module, passes::defaultPipeline(), options);
  if (!status)
    return fail(model + ": " + status.message());
  std::string text = ir::print(**module);
  if (!output.empty()) {
    if (Status s = writeFileAtomically(output, text); !s)
      return fail(s.message());
  }
  if (emit == "ir")
    std::cout << text;
  else if (emit == "json")
    std::cout << tools::planJson(**module);
  else if (emit == "report")
    std::cout << tools::explain(**module);
  return 0;
}

int explainCommand(const std::vector<std::string> &args) {
  if (args.size() != 1)
    return fail("explain: usage: ganc explain PLAN");
  auto plan = ir::readPlan(args[0]);
  if (!plan)
    return fail(plan.status().message());
  std::cout << tools::explain(**plan);
  return 0;
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
  if (command == "train")
    return tools::trainCommand(args);
  if (command == "run")
    return tools::runCommand(argv[0], args);
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  return fail("unknown command '" + command + "' (see ganc --help)");
}
