// The pass interface, the registry built from Passes.def, and the pipeline runner.
#pragma once

#include "ir/Module.h"

#include <functional>
#include <string>
#include <vector>

namespace ganc::passes {

using ir::Block;
using ir::Op;
using ir::Value;

/// Options every pass may read. The defaults are DDP's.
struct PassOptions {
  int64_t bucketCapBytes = int64_t{25} << 20;
  int64_t firstBucketCapBytes = int64_t{1} << 20;
  /// Sharded optimizer state: 0 off, 1 or 2 (ZeRO stage); -1 keeps the module's (the spec's).
  int zeroStage = -1;
  /// The world size to plan shards for (0 or 1: none; the runtime plans them at start-up).
  int64_t ranks = 0;
};

/// A pass rewrites or annotates the module and says whether it changed anything.
using PassFn = Expected<bool> (*)(ir::Module &, const PassOptions &);

struct PassInfo {
  const char *name;
  PassFn run;
  const char *description;
};

/// Every pass, in default pipeline order.
const std::vector<PassInfo> &allPasses();
/// The pass called `name`, or null.
const PassInfo *findPass(const std::string &name);
/// The default compile pipeline: every pass in Passes.def order.
std::vector<std::string> defaultPipeline();

struct PipelineOptions {
  PassOptions pass;
  /// Run the IR verifier's invariant checks after every pass (on in tests and in ganc-opt).
  /// The model rules (ir::verifyModelRules) are checked after every pass regardless.
  bool verifyEach = true;
  /// Called after each pass with its name, so drivers can print the IR after it.
  std::function<void(const std::string &, const ir::Module &)> afterPass;
};

/// Runs the named passes in order; stops at the first failure, naming the pass.
Status runPipeline(ir::Module &module, const std::vector<std::string> &names,
                   const PipelineOptions &options);

// The passes themselves, one file each (see Passes.def).
#define GANC_PASS(NAME, FN, DESC) Expected<bool> FN(ir::Module &, const PassOptions &);
#include "passes/Passes.def"

} // namespace ganc::passes
