// The run directory (--out): claimed before training so that a run is never overwritten by
// accident, `--resume auto` resolved in it, the run's record (run.json) and the rotation of
// step checkpoints.
#pragma once

#include "frontend/Spec.h"
#include "runtime/Options.h"
#include "support/Status.h"

#include <map>
#include <string>
#include <vector>

namespace ganc::runtime {

struct Session;

/// Rank 0, before anything is trained: creates --out and locks it for the life of the process
/// (an flock on `--out/.ganc-lock`, which the kernel releases when the process ends, kill -9
/// included): a second run there is refused naming the holder's pid. Then refuses an --out
/// that holds a run unless the run is resumed or --force is given (then ganc's files in it
/// are removed, but for checkpoint.pt, kept as checkpoint-replaced.pt until this run writes
/// its first checkpoint: --resume auto never takes it for this run's).
Status claimRunDir(const TrainOptions &options);

/// `--resume auto`: --out's checkpoint.pt if it is whole (its zip records and CRCs check);
/// where it is missing or damaged, the most recently written step snapshot that is whole
/// (said on stdout when `say`); "" where --out holds no checkpoint at all (start at step 0).
/// Where checkpoints are there and none is whole, an error: a fresh start would rotate them
/// away. Any other value is returned as it is.
Expected<std::string> resolveResume(const TrainOptions &options, bool say);

/// Rank 0, resuming at `step`: the rows of loss_history.csv, stats.jsonl and metrics.jsonl that
/// the run wrote beyond its checkpoint are dropped, so the resumed run's rows follow on without
/// duplicates.
Status truncateHistory(const std::string &outDir, int64_t step);

/// Rank 0 writes --out/run.json: the options, world size, device, where the run starts,
/// and the effective spec (the archive's, with the command line's overrides); and
/// --out/plan.ganc, the plan this segment trains (the command line's recipes in it), which
/// `ganc explain OUT` reads.
/// A resumed run keeps the run.json it continues (the first segment's settings stay at its
/// top level) and appends a segment: when and where it started, its options, and `changes`,
/// the settings it changed with --accept-changes (session.acceptedChanges).
Status writeRunRecord(const Session &session, int64_t firstStep, const std::string &resumedFrom);

/// Writes a checkpoint's bytes for `step` steps done: checkpoint-STEP.pt, and checkpoint.pt
/// (the latest; a hard link to it), both atomically; step checkpoints beyond the newest
/// `keep` are removed. With keep 0 only checkpoint.pt is written.
Status storeCheckpoint(const std::string &outDir, int64_t step, const std::vector<char> &bytes,
                       int64_t keep);

} // namespace ganc::runtime
