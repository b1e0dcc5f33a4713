// ganc: the command-line driver (compile, explain, train, run).
#include "frontend/Frontend.h"
#include "frontend/SpecSchema.h"
#include "ir/Plan.h"
#include "passes/BucketAutotune.h"
#include "passes/Pass.h"
#include "perf/CommModel.h"
#include "support/Files.h"
#include "support/Json.h"
#include "support/PythonCommand.h"
#include "support/TextFormat.h"
#include "tools/CommonOptions.h"
#include "tools/JointCommand.h"
#include "tools/MetricsCommand.h"
#include "tools/Report.h"
#include "tools/Simulate.h"
#include "tools/TrainCommands.h"

#include <nlohmann/json.hpp>
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
  compile MODEL.pt -o PLAN [options]   lower a TorchScript GAN archive (with its ganc.json
                                       spec) to the ganc IR, find the parameters each phase
                                       trains, bucket their all-reduces, write the plan
  explain PLAN|RUN_DIR [--json]        per phase: used and unused parameters, buckets,
                                       all-reduce order and bytes per step (of a run
                                       directory: the plan the run trained)
  train PLAN --model MODEL.pt [options]
                                       one rank; reads RANK, WORLD_SIZE, LOCAL_RANK,
                                       MASTER_ADDR, MASTER_PORT like torchrun
  run --nproc N PLAN --model MODEL.pt [options]
                                       start N local ranks of `ganc train`
  metrics RUN_DIR|CHECKPOINT --metrics fid50k,kid50k
                                       score a run's snapshot (FID, KID) as training does
  simulate PLAN --profile TIMING.json --gpus 1,8,64 [options]
                                       predicted step time and scaling efficiency per world
                                       size, from a `ganc train --profile` run
  spec FILE|-                          check a spec (ganc.json) with the C++ validator
  joint GRAPH.pt [--inputs T.pt -o O.pt]
                                       a phase's joint graph (ganc.joint): its ops and used
                                       parameters; run through the dispatcher on given tensors
  plot OUT [-o PNG]                    a run's loss curves as a PNG (Python, matplotlib)
  stylegan --outdir DIR --data ZIP --networks REPO [options]
                                       a StyleGAN2 run shaped like NVIDIA's train.py: export,
                                       compile, train, network-snapshot-KIMG.pkl (Python)
  (ganc COMMAND --help lists each command's options; ganc --version says which ganc;
   docs/cli.md has them all)

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
  passes::AutotuneOptions tune;
  passes::PipelineOptions options;
  /// --fusion: record in the plan what the runtime fuses in each phase.
  bool fusion = true;
  bool help = false;
};

perf::Topology &topologyOf(CompileArgs &c) { return c.tune.topology; }

const Command<CompileArgs> &compileTable() {
  using S = const std::string;
  using C = CompileArgs;
  static const Command<CompileArgs> command = [] {
    Command<CompileArgs> c{
        {"ganc compile",
         {"MODEL.pt -o PLAN [options]"},
         "Lowers every phase of a TorchScript GAN archive (with its ganc.json spec) to the ganc "
         "IR, finds the parameters each phase trains, buckets their all-reduces, and writes the "
         "plan.",
         {},
         ""},
        {{"--output",
          "PLAN",
          "where the plan goes (written atomically, with its checksum)",
          [](S &, S &v, C &c) { c.output = v; },
          {"-o"}},
         {"--bucket-cap-mb", "N|auto",
          "bucket cap in MiB (default 25, DDP's); auto picks each phase's caps that leave the "
          "least communication exposed at --target-gpus ranks, simulated from a `ganc train "
          "--profile` run on the links the link options describe (as ganc simulate's)",
          [](S &f, S &v, C &c) {
            if (v == "auto")
              c.autotune = true;
            else
              c.options.pass.bucketCapBytes = tools::mebibytes(f, v);
          }},
         {"--first-bucket-mb", "N", "the first bucket's cap in MiB (default 1, DDP's)",
          [](S &f, S &v, C &c) { c.options.pass.firstBucketCapBytes = tools::mebibytes(f, v); }},
         {"--zero", "0|1|2",
          "shards optimizer state (1) and gradients too (2), or neither (0); the spec's `zero` "
          "otherwise",
          [](S &f, S &v, C &c) { c.options.pass.zeroStage = tools::zeroStage(f, v); }},
         {"--ranks", "N",
          "lays the shards out for N ranks (a run on another world size re-plans them)",
          [](S &f, S &v, C &c) { c.options.pass.ranks = tools::worldSize(f, v); }},
         {"--emit", "ir|json|report",
          "print the plan to stdout as IR text, JSON or `ganc explain`'s report",
          [](S &f, S &v, C &c) {
            c.emit =
                choice<std::string>(f, v, {{"ir", "ir"}, {"json", "json"}, {"report", "report"}});
          }},
         {"--print-ir-after", "PASS", "print the IR after pass PASS (see ganc-opt --help)",
          [](S &f, S &v, C &c) {
            if (!passes::findPass(v))
              throw OptionError(f + " names unknown pass '" + v + "'");
            c.printAfter = v;
          }},
         {"--fusion", "on|off",
          "fuse each phase's resamplings (pad, zero insertion, constant FIR filter, stride) "
          "into ganc::upfirdn2d and its bias + activation + gain + clamp into ganc::bias_act "
          "(on, the default; ganc explain lists what was fused and what was not, and why)",
          [](S &f, S &v, C &c) {
            c.fusion = choice<bool>(f, v, {{"on", true}, {"off", false}});
          }},
         {"--op-library", "LIB.so",
          "loads a TORCH_LIBRARY operator library the archive's code calls (it was exported "
          "with ganc.export(..., op_libraries=[...])); repeat it or list them with commas",
          appendPaths(&C::opLibraries)},
         {"--target-gpus", "N", "with --bucket-cap-mb auto: the world size to tune buckets for",
          [](S &f, S &v, C &c) { c.tune.ranks = tools::worldSize(f, v); }},
         {"--profile", "TIMING.json",
          "with --bucket-cap-mb auto: the timing `ganc train --profile` wrote",
          [](S &, S &v, C &c) { c.tune.profile = v; }}},
        [](S &argument, C &c) {
          if (!c.model.empty())
            throw OptionError("more than one model given ('" + c.model + "', '" + argument + "')");
          c.model = argument;
        }};
    for (Option<CompileArgs> &option : perf::topologyOptions(&topologyOf))
      c.options.push_back(std::move(option));
    return c;
  }();
  return command;
}

/// Reads `ganc compile`'s command line and checks it; errors are one line for fail().
Status parseCompileArgs(const std::vector<std::string> &args, CompileArgs &c) {
  GANC_TRY(compileTable().parse(args, c, c.help));
  if (c.help)
    return Status::ok();
  if (c.model.empty())
    return Status::error("no MODEL.pt given (ganc compile MODEL.pt -o PLAN)");
  if (c.output.empty() && c.emit.empty())
    return Status::error("say where the plan goes with -o PLAN");
  if (c.autotune && (c.tune.ranks == 0 || c.tune.profile.empty()))
    return Status::error("--bucket-cap-mb auto needs --target-gpus N and --profile TIMING.json "
                         "(from ganc train --profile)");
  if (!c.autotune && (c.tune.ranks || !c.tune.profile.empty()))
    return Status::error("--target-gpus and --profile tune buckets: add --bucket-cap-mb auto");
  if (!c.autotune && c.tune.topology.given)
    return Status::error("--link, --intra-link, --ranks-per-host, --alpha-us and "
                         "--bandwidth-gbps describe the links buckets are tuned for: add "
                         "--bucket-cap-mb auto");
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
    std::cout << compileTable().documented().usage();
    return 0;
  }
  if (Status s = frontend::loadOpLibraries(c.opLibraries); !s)
    return fail("compile: " + s.message());
  auto archive = frontend::loadArchive(c.model);
  if (!archive)
    return fail(archive.status().message());
  auto module = frontend::lowerToIR(*archive, c.fusion);
  if (!module)
    return fail(module.status().message());
  if (Status s = frontend::lowerJointGraphs(*archive, **module); !s)
    return fail(s.message());
  if (!c.printAfter.empty())
    c.options.afterPass = [&](const std::string &name, const ir::Module &m) {
      if (name == c.printAfter)
        std::cout << "// IR after " << name << "\n" << ir::print(m);
    };
  Status status = ir::verify(**module).withContext("lowered IR is invalid");
  if (status)
    status = passes::runPipeline(**module, passes::defaultPipeline(), c.options);
  if (status && c.autotune)
    status = passes::autotuneBuckets(**module, c.tune, c.options);
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

struct ExplainArgs {
  std::string plan;
  bool json = false, help = false;
};

const Command<ExplainArgs> &explainTable() {
  static const Command<ExplainArgs> command = {
      {"ganc explain",
       {"PLAN [--json]", "RUN_DIR [--json]"},
       "Per phase: how it is replayed, the used, unused, conditional and frozen parameters with "
       "sizes, the optimizer groups it steps, its training-step features, and its buckets in "
       "all-reduce order with the bytes per step. Given a run directory (ganc train's --out), "
       "the plan that run trained, the command line's --precision, --accumulate, --interval "
       "and --clip in it.",
       {},
       ""},
      {{"--json", "", "the same plan as JSON (what compile --emit json prints)",
        storeTrue(&ExplainArgs::json)}},
      [](const std::string &argument, ExplainArgs &e) {
        if (!e.plan.empty())
          throw OptionError("usage: ganc explain PLAN|RUN_DIR [--json]");
        e.plan = argument;
      }};
  return command;
}

int explainCommand(const std::vector<std::string> &args) {
  ExplainArgs e;
  if (Status s = explainTable().parse(args, e, e.help); !s)
    return fail("explain: " + s.message());
  if (e.help) {
    std::cout << explainTable().documented().usage();
    return 0;
  }
  if (e.plan.empty())
    return fail("explain: usage: ganc explain PLAN|RUN_DIR [--json]");
  std::error_code ec;
  if (std::filesystem::is_directory(e.plan, ec)) {
    const std::string trained = (std::filesystem::path(e.plan) / "plan.ganc").string();
    if (!std::filesystem::exists(trained, ec))
      return fail("explain: " + e.plan +
                  " is a directory without plan.ganc: not the --out of a ganc train run "
                  "(or of one older than the plan record)");
    e.plan = trained;
  }
  auto plan = ir::readPlan(e.plan);
  if (!plan)
    return fail(plan.status().message());
  std::cout << (e.json ? tools::planJson(**plan) : tools::explain(**plan));
  return 0;
}

struct SpecArgs {
  std::string file;
  bool markdown = false, fieldsJson = false, each = false, help = false;
};

const Command<SpecArgs> &specTable() {
  static const Command<SpecArgs> command = {
      {"ganc spec",
       {"FILE|-", "--each", "--markdown", "--fields-json"},
       "Checks a spec (ganc.json, as JSON text) with the validator `ganc compile` uses, and says "
       "what is wrong in one line (exit 2). `ganc.validate` runs it too, so a spec is checked by "
       "one validator; the checks that need the live module stay in Python.",
       {},
       ""},
      {{"--each", "",
        "FILE holds a JSON list of specs: check each and print one line per spec, `ok` or what "
        "is wrong (exit 0 once all are read)",
        storeTrue(&SpecArgs::each)},
       {"--markdown", "", "print docs/spec.md's field table (frontend/SpecFields.def) and exit",
        storeTrue(&SpecArgs::markdown)},
       {"--fields-json", "",
        "print every object's keys and the versions that added them, as JSON (what the Python "
        "package reads) and exit",
        storeTrue(&SpecArgs::fieldsJson)}},
      [](const std::string &argument, SpecArgs &a) {
        if (!a.file.empty())
          throw OptionError("more than one spec given");
        a.file = argument;
      }};
  return command;
}

int specCommand(const std::vector<std::string> &args) {
  SpecArgs a;
  if (Status s = specTable().parse(args, a, a.help); !s)
    return fail("spec: " + s.message());
  if (a.help) {
    std::cout << specTable().documented().usage();
    return 0;
  }
  if (a.markdown || a.fieldsJson) {
    std::cout << (a.markdown ? frontend::specFieldsMarkdown() : frontend::specFieldsJson());
    return 0;
  }
  if (a.file.empty())
    return fail("spec: give a spec file, or - for standard input");
  auto text = readTextOrStdin(a.file);
  if (!text)
    return fail("spec: " + text.status().message());
  if (a.each) {
    const std::string what = a.file == "-" ? std::string("spec --each") : a.file;
    auto specs = parseJson(*text, what);
    if (!specs)
      return fail(specs.status().message());
    if (!specs->is_array())
      return fail(what + ": --each reads a JSON list of specs");
    for (const nlohmann::json &one : *specs) {
      auto spec = frontend::parseSpec(one.dump());
      std::cout << (spec ? std::string("ok") : spec.status().message()) << "\n";
    }
    return 0;
  }
  auto spec = frontend::parseSpec(*text);
  if (!spec)
    return fail((a.file == "-" ? std::string("spec") : a.file) + ": " + spec.status().message());
  return 0;
}

/// `ganc train`'s options and their values, as JSON: what the Python API maps its keywords
/// with (python/ganc/train_options.json, generated by scripts/gen_docs.py).
std::string trainOptionsJson() {
  nlohmann::ordered_json options = nlohmann::ordered_json::object();
  for (const OptionDoc &o : tools::trainCommandDoc().options)
    options[o.name] = o.value;
  nlohmann::ordered_json j = {{"comment",
                               "generated from ganc train's option table by `ganc --options-json` "
                               "(scripts/gen_docs.py); do not edit"},
                              {"train", options}};
  return j.dump(1) + "\n";
}

/// docs/cli.md: every command's options, from the tables that parse them (ganc-opt's section
/// comes from `ganc-opt --help-markdown`).
std::string cliMarkdown() {
  std::string out = "# Command line\n\n"
                    "Generated from the option tables the commands parse with (`ganc "
                    "--help-markdown`, `ganc-opt --help-markdown`); do not edit by hand: "
                    "`python scripts/gen_docs.py` rewrites it and the tests fail when it is "
                    "stale. Every option takes its value as `--flag value` or `--flag=value`.\n\n";
  out += "```\n" + std::string(kUsage) + "```\n\n";
  for (const CommandDoc &doc :
       {compileTable().documented(), explainTable().documented(), tools::trainCommandDoc(),
        tools::runCommandDoc(), tools::metricsCommandDoc(), tools::simulateCommandDoc(),
        tools::jointCommandDoc(), specTable().documented()})
    out += doc.markdown();
  return out;
}

/// `ganc plot` is Python (matplotlib): run it with the Python ganc was installed into.
int plotCommand(const std::vector<std::string> &args) {
  std::vector<std::string> command = {support::python(), "-m", "ganc.plot"};
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
  if (command == "metrics")
    return tools::metricsCommand(argv[0], args);
  if (command == "spec")
    return specCommand(args);
  if (command == "joint")
    return tools::jointCommand(args);
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
  if (command == "--options-json") {
    std::cout << trainOptionsJson();
    return 0;
  }
  if (command == "--help-markdown") {
    std::cout << cliMarkdown();
    return 0;
  }
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  return fail("unknown command '" + command + "' (see ganc --help)");
}
