// `ganc compile --bucket-cap-mb auto`: per phase, the bucket caps that leave the least
// communication exposed after backward at a target world size, by the simulator's model.
#pragma once

#include "ir/Module.h"
#include "passes/Pass.h"
#include "perf/CommModel.h"

#include <string>

namespace ganc::passes {

struct AutotuneOptions {
  /// A `ganc train --profile` of this model (each used parameter's gradient ready time).
  std::string profile;
  int64_t ranks = 0;
  /// Links as in `ganc simulate` (within a host up to ranksPerHost ranks, across hosts).
  perf::Topology topology;
};

/// For every phase of the compiled `plan`: buckets its used parameters with each candidate
/// cap (256 KiB to 100 MiB, and one bucket; the first bucket at 1 MiB or at the cap), times
/// the all-reduces as `ganc simulate` does from the profile's ready times, keeps the caps
/// with the least exposed communication in the phase if that makes the phase at least 2 %
/// faster than DDP's caps do, else DDP's (bucket_cap, and the prediction beside DDP's
/// defaults as `tuned`), and re-runs the passes from bucketing on. Errors are bad input.
Status autotuneBuckets(ir::Module &plan, const AutotuneOptions &options,
                       const PipelineOptions &pipeline);

} // namespace ganc::passes
