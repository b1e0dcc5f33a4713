// ganc-opt: runs named passes over ganc IR text and prints the result (for FileCheck tests).
#include "ir/Module.h"
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
         "  --no-verify           do not run the verifier after each pass\n"
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

/// Processes one input; returns false after printing its error.
bool processOne(const std::string &text, const std::vector<std::string> &pipeline,
                passes::PipelineOptions options, bool splitMode) {
  auto module = ir::parse(text);
  Status status = module ? ir::verify(**module) : module.status();
  if (status)
    status = passes::runPipeline(**module, pipeline, options);
  if (!status) {
    // In split mode the error goes to stdout too, in order, so one FileCheck sees every case.
    (splitMode ? std::cout : std::cerr) << "ganc-opt: error: " << status.message() << "\n";
    return false;
  }
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

} // namespace

int main(int argc, char **argv) {
  std::vector<std::string> pipeline;
  std::string file, printAfter, value;
  bool split = false;
  passes::PipelineOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage(std::cout);
      return 0;
    } else if (flagValue(arg, "--pass", value)) {
      if (!passes::findPass(value)) {
        std::cerr << "ganc-opt: error: unknown pass '" << value << "' (see --help)\n";
        return 2;
      }
      pipeline.push_back(value);
    } else if (arg == "--pipeline") {
      for (const std::string &name : passes::defaultPipeline())
        pipeline.push_back(name);
    } else if (flagValue(arg, "--print-ir-after", value)) {
      printAfter = value;
    } else if (arg == "--split-input-file") {
      split = true;
    } else if (flagValue(arg, "--bucket-cap-mb", value)) {
      options.pass.bucketCapBytes = static_cast<int64_t>(std::stod(value) * 1024 * 1024);
    } else if (flagValue(arg, "--first-bucket-mb", value)) {
      options.pass.firstBucketCapBytes = static_cast<int64_t>(std::stod(value) * 1024 * 1024);
    } else if (arg == "--no-verify") {
      options.verifyEach = false;
    } else if (!arg.empty() && arg[0] == '-' && arg != "-") {
      std::cerr << "ganc-opt: error: unknown option '" << arg << "' (see --help)\n";
      return 2;
    } else {
      file = arg;
    }
  }
  if (file.empty()) {
    usage(std::cerr);
    return 2;
  }
  std::stringstream buffer;
  if (file == "-") {
    buffer << std::cin.rdbuf();
  } else {
    std::ifstream in(file);
    if (!in) {
      std::cerr << "ganc-opt: error: cannot read " << file << "\n";
      return 2;
    }
    buffer << in.rdbuf();
  }
  if (!printAfter.empty())
    options.afterPass = [&](const std::string &name, const ir::Module &m) {
      if (name == printAfter)
        std::cout << "// IR after " << name << "\n" << ir::print(m);
    };

  std::vector<std::string> inputs =
      split ? splitInput(buffer.str()) : std::vector<std::string>{buffer.str()};
  bool ok = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i)
      std::cout << "// -----\n";
    ok &= processOne(inputs[i], pipeline, options, split);
  }
  return ok ? 0 : 2;
}
