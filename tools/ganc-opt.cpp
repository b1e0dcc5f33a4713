// ganc-opt: runs named passes over ganc IR text and prints the result (for FileCheck tests), or
// writes it as a checksummed plan.
#include "ir/Files.h"
#include "ir/Module.h"
#include "ir/TextFormat.h"
#include "passes/Pass.h"

#include <fstream>
#include <iostream>
#include <sstream>

using namespace ganc;

namespace {

void usage(std::ostream &out) {
  out << "usage: ganc-opt [options] FILE|-\n"
         "  --pass=NAME           run one pass (repeatable, in order)\n"
         "  --pipeline            run the default compile pipeline\n"
         "  --print-ir-after=NAME print the IR after pass NAME to stdout\n"
         "  --split-input-file    treat '// -----' lines as separators of independent inputs\n"
         "  --bucket-cap-mb=N     bucket cap in MiB (default 25)\n"
         "  --first-bucket-mb=N   first bucket cap in MiB (default 1)\n"
         "  --zero=N              sharded optimizer state stage (0, 1, 2; default: the IR's)\n"
         "  --ranks=N             the world size the sharding pass lays shards out for\n"
         "  --no-verify           do not run the verifier after each pass\n"
         "  -o FILE               write the verified result as a plan, with its checksum line\n"
         "                        (what `ganc train` reads after a plan was edited by hand)\n"
         "passes:\n";
  for (const passes::PassInfo &info : passes::allPasses())
    out << "  " << info.name << std::string(18 - std::string(info.name).size(), ' ')
        << info.description << "\n";
}

bool flagValue(const std::string &arg, const std::string &flag, std::string &value) {
  if (arg.rfind(flag + "=", 0) != 0)
    return false;
  value = arg.substr(flag.size() + 1);
  return true;
}

/// What the command line asks for.
struct Options {
  std::vector<std::string> pipeline;
  std::string file, printAfter, output;
  bool split = false;
  passes::PipelineOptions pipelineOptions;
};

/// Processes one input; returns false after printing its error. The result goes to stdout,
/// or, stamped with its checksum, to `options.output`.
bool processOne(const std::string &text, const Options &options) {
  auto module = ir::parse(text);
  Status status = module ? ir::verify(**module) : module.status();
  if (status)
    status = passes::runPipeline(**module, options.pipeline, options.pipelineOptions);
  if (status && !options.output.empty())
    status = writeFileAtomically(options.output, ir::stampPlan(ir::print(**module)));
  if (!status) {
    // In split mode the error goes to stdout too, in order, so one FileCheck sees every case.
    (options.split ? std::cout : std::cerr) << "ganc-opt: error: " << status.message() << "\n";
    return false;
  }
  if (options.output.empty())
    std::cout << ir::print(**module);
  return true;
}

/// The cases of a --split-input-file input, separated by "// -----" lines.
std::vector<std::string> splitInput(const std::string &text) {
  std::vector<std::string> inputs;
  std::string current, line;
  std::istringstream lines(text);
  while (std::getline(lines, line)) {
    if (line.rfind("// -----", 0) == 0) {
      inputs.push_back(current);
      current.clear();
    } else {
      current += line + "\n";
    }
  }
  inputs.push_back(current);
  return inputs;
}

/// A bucket cap in MiB as bytes: a finite number in [0, 1 TiB).
Status parseMiB(const std::string &flag, const std::string &value, int64_t &bytes) {
  std::optional<double> mib = ir::parseDouble(value);
  if (!mib || *mib < 0 || *mib >= 1024.0 * 1024.0)
    return Status::error(flag + " must be a number of MiB in [0, 1048576), got '" + value + "'");
  bytes = static_cast<int64_t>(*mib * 1024 * 1024);
  return Status::ok();
}

/// Reads the command line into `o`; `help` is set by --help.
Status parseArgs(int argc, char **argv, Options &o, bool &help) {
  std::string value;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help = true;
    } else if (flagValue(arg, "--pass", value)) {
      if (!passes::findPass(value))
        return Status::error("unknown pass '" + value + "' (see --help)");
      o.pipeline.push_back(value);
    } else if (arg == "--pipeline") {
      for (const std::string &name : passes::defaultPipeline())
        o.pipeline.push_back(name);
    } else if (flagValue(arg, "--print-ir-after", value)) {
      o.printAfter = value;
    } else if (arg == "--split-input-file") {
      o.split = true;
    } else if (flagValue(arg, "--bucket-cap-mb", value)) {
      GANC_TRY(parseMiB("--bucket-cap-mb", value, o.pipelineOptions.pass.bucketCapBytes));
    } else if (flagValue(arg, "--first-bucket-mb", value)) {
      GANC_TRY(parseMiB("--first-bucket-mb", value, o.pipelineOptions.pass.firstBucketCapBytes));
    } else if (flagValue(arg, "--zero", value)) {
      std::optional<int64_t> stage = ir::parseInt64(value);
      if (!stage || *stage < 0 || *stage > 2)
        return Status::error("--zero must be 0, 1 or 2, got '" + value + "'");
      o.pipelineOptions.pass.zeroStage = static_cast<int>(*stage);
    } else if (flagValue(arg, "--ranks", value)) {
      std::optional<int64_t> ranks = ir::parseInt64(value);
      if (!ranks || *ranks < 1)
        return Status::error("--ranks must be a positive integer, got '" + value + "'");
      o.pipelineOptions.pass.ranks = *ranks;
    } else if (arg == "--no-verify") {
      o.pipelineOptions.verifyEach = false;
    } else if (arg == "-o" && i + 1 < argc) {
      o.output = argv[++i];
    } else if (!arg.empty() && arg[0] == '-' && arg != "-") {
      return Status::error("unknown option '" + arg + "' (see --help)");
    } else {
      o.file = arg;
    }
  }
  if (!o.output.empty() && (o.split || !o.pipelineOptions.verifyEach))
    return Status::error("-o writes one verified plan: not with --split-input-file or --no-verify");
  return Status::ok();
}

} // namespace

int main(int argc, char **argv) {
  Options options;
  bool help = false;
  if (Status s = parseArgs(argc, argv, options, help); !s) {
    std::cerr << "ganc-opt: error: " << s.message() << "\n";
    return 2;
  }
  if (help || options.file.empty()) {
    usage(help ? std::cout : std::cerr);
    return help ? 0 : 2;
  }
  std::string text;
  if (options.file == "-") {
    std::stringstream buffer;
    buffer << std::cin.rdbuf();
    text = buffer.str();
  } else {
    auto bytes = readFile(options.file);
    if (!bytes) {
      std::cerr << "ganc-opt: error: " << bytes.status().message() << "\n";
      return 2;
    }
    text.assign(bytes->begin(), bytes->end());
  }
  if (!options.printAfter.empty())
    options.pipelineOptions.afterPass = [&](const std::string &name, const ir::Module &m) {
      if (name == options.printAfter)
        std::cout << "// IR after " << name << "\n" << ir::print(m);
    };
  std::vector<std::string> inputs =
      options.split ? splitInput(text) : std::vector<std::string>{text};
  bool ok = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i)
      std::cout << "// -----\n";
    ok &= processOne(inputs[i], options);
  }
  return ok ? 0 : 2;
}
