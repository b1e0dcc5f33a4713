// ganc-opt: runs named passes over ganc IR text and prints the result (for FileCheck tests), or
// writes it as a checksummed plan.
#include "ir/Module.h"
#include "ir/PhaseAttrs.h"
#include "ir/Plan.h"
#include "passes/BucketAutotune.h"
#include "passes/Pass.h"
#include "perf/CommModel.h"
#include "support/Files.h"
#include "support/Options.h"
#include "support/TextFormat.h"
#include "tools/CommonOptions.h"

#include <fstream>
#include <iostream>
#include <sstream>

using namespace ganc;

namespace {

/// What the command line asks for.
struct Options {
  std::vector<std::string> pipeline;
  std::string file, printAfter, output;
  bool split = false;
  bool listAttributes = false;
  /// --autotune-profile: bucket caps tuned after the passes (passes/BucketAutotune).
  passes::AutotuneOptions tune;
  passes::PipelineOptions pipelineOptions;
};

/// Processes one input; returns false after printing its error. The result goes to stdout,
/// or, stamped with its checksum, to `options.output`.
bool processOne(const std::string &text, const Options &options) {
  auto module = ir::parse(text);
  Status status = module ? ir::verify(**module) : module.status();
  if (status)
    status = passes::runPipeline(**module, options.pipeline, options.pipelineOptions);
  if (status && !options.tune.profile.empty())
    status = passes::autotuneBuckets(**module, options.tune, options.pipelineOptions);
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

perf::Topology &topologyOf(Options &o) { return o.tune.topology; }

const Command<Options> &optTable() {
  using S = const std::string;
  using O = Options;
  std::string passList;
  for (const passes::PassInfo &info : passes::allPasses())
    passList += std::string("  ") + info.name +
                std::string(18 - std::string(info.name).size(), ' ') + info.description + "\n";
  static const Command<Options> command = [&passList] {
    Command<Options> c = {
        {"ganc-opt",
         {"[options] FILE|-"},
         "Runs named passes over ganc IR text and prints the result (what the lit/FileCheck tests "
         "drive), or writes it as a checksummed plan.",
         {},
         "passes:\n" + passList},
        {{"--pass", "NAME", "run one pass (repeatable, in order)",
          [](S &f, S &v, O &o) {
            if (!passes::findPass(v))
              throw OptionError("unknown pass '" + v + "' (see --help)");
            o.pipeline.push_back(v);
          }},
         {"--pipeline", "", "run the default compile pipeline",
          [](S &, S &, O &o) {
            for (const std::string &name : passes::defaultPipeline())
              o.pipeline.push_back(name);
          }},
         {"--print-ir-after", "NAME", "print the IR after pass NAME to stdout",
          storeText(&O::printAfter)},
         {"--split-input-file", "", "treat '// -----' lines as separators of independent inputs",
          storeTrue(&O::split)},
         {"--bucket-cap-mb", "N", "bucket cap in MiB (default 25)",
          [](S &f, S &v, O &o) { o.pipelineOptions.pass.bucketCapBytes = tools::mebibytes(f, v); }},
         {"--first-bucket-mb", "N", "first bucket cap in MiB (default 1)",
          [](S &f, S &v, O &o) {
            o.pipelineOptions.pass.firstBucketCapBytes = tools::mebibytes(f, v);
          }},
         {"--zero", "0|1|2", "sharded optimizer state stage (default: the IR's)",
          [](S &f, S &v, O &o) { o.pipelineOptions.pass.zeroStage = tools::zeroStage(f, v); }},
         {"--ranks", "N", "the world size the sharding pass lays shards out for",
          [](S &f, S &v, O &o) { o.pipelineOptions.pass.ranks = tools::worldSize(f, v); }},
         {"--no-verify", "", "do not run the verifier after each pass",
          [](S &, S &, O &o) { o.pipelineOptions.verifyEach = false; }},
         {"--autotune-profile", "FILE",
          "after the passes, tune each phase's bucket caps for --target-gpus ranks from this "
          "`ganc train --profile` timing (what ganc compile --bucket-cap-mb auto runs)",
          [](S &, S &v, O &o) { o.tune.profile = v; }},
         {"--target-gpus", "N", "with --autotune-profile: the world size to tune for",
          [](S &f, S &v, O &o) { o.tune.ranks = tools::worldSize(f, v); }},
         {"--list-phase-attributes", "",
          "print the phase attribute table (ir/PhaseAttrs.def) as Markdown and exit",
          storeTrue(&O::listAttributes)},
         {"--output",
          "FILE",
          "write the verified result as a plan, with its checksum line (what `ganc train` reads "
          "after a plan was edited by hand)",
          storeText(&O::output),
          {"-o"}}},
        [](S &argument, O &o) {
          if (!o.file.empty())
            throw OptionError("more than one input given ('" + o.file + "', '" + argument + "')");
          o.file = argument;
        }};
    for (Option<Options> &option : perf::topologyOptions(&topologyOf))
      c.options.push_back(std::move(option));
    return c;
  }();
  return command;
}

/// The phase attributes as docs/ir.md lists them: keyword, syntax, meaning.
std::string phaseAttributesMarkdown() {
  std::string out = "| attribute | syntax | meaning |\n| --- | --- | --- |\n";
  for (const ir::PhaseAttr &attr : ir::phaseAttrs())
    out += std::string("| `") + attr.keyword + "` | `" + attr.keyword + " " + attr.form() + "` | " +
           attr.help + " |\n";
  return out;
}

/// Reads the command line into `o`; `help` is set by --help.
Status parseArgs(int argc, char **argv, Options &o, bool &help) {
  GANC_TRY(optTable().parse(std::vector<std::string>(argv + 1, argv + argc), o, help));
  if (o.tune.profile.empty() != (o.tune.ranks == 0) ||
      (o.tune.profile.empty() && o.tune.topology.given))
    return Status::error("--autotune-profile FILE and --target-gpus N go together (the link "
                         "options describe the links they tune for)");
  if (!o.output.empty() && (o.split || !o.pipelineOptions.verifyEach))
    return Status::error("-o writes one verified plan: not with --split-input-file or --no-verify");
  return Status::ok();
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 2 && std::string(argv[1]) == "--help-markdown") {
    std::cout << optTable().documented().markdown();
    return 0;
  }
  Options options;
  bool help = false;
  if (Status s = parseArgs(argc, argv, options, help); !s) {
    std::cerr << "ganc-opt: error: " << s.message() << "\n";
    return 2;
  }
  if (options.listAttributes) {
    std::cout << phaseAttributesMarkdown();
    return 0;
  }
  if (help || options.file.empty()) {
    (help ? std::cout : std::cerr) << optTable().documented().usage();
    return help ? 0 : 2;
  }
  auto read = readTextOrStdin(options.file);
  if (!read) {
    std::cerr << "ganc-opt: error: " << read.status().message() << "\n";
    return 2;
  }
  const std::string &text = *read;
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
