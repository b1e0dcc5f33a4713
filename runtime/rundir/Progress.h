// What a run reports while it trains: the losses (loss_history.csv and the progress line)
// and the timing of every step and phase run (timing.json).
#pragma once

#include "backend/Device.h"
#include "runtime/Session.h"
#include "runtime/rundir/TensorBoard.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ganc::runtime {

class Progress {
public:
  /// `firstStep` is where this run starts (after a resume, the history is appended to).
  Progress(Session &session, int64_t firstStep);

  void beginStep();
  /// Around one run of phase `key`: its host time, and its device time on CUDA.
  void beginPhase();
  void endPhase(int64_t step, const std::string &key, const backend::RunStats &run,
                double hostWorkSeconds);
  /// With --profile, after every run of phase `key`: counts it, and keeps its times (compute,
  /// bucket and parameter ready times, optimizer seconds) when the run was timed.
  void addProfile(const std::string &key, const backend::RunStats &run);
  /// Host seconds the optimizers took (part of the work on CPU).
  void addOptimizerSeconds(double seconds) { stepWork_ += seconds; }
  /// A phase's loss, still on the device: it is read only when a progress line needs it,
  /// so the host never waits for the GPU between steps.
  void addLoss(int64_t step, const std::string &phase, const at::Tensor &loss);
  /// The values a phase logged besides its loss (read, like the losses, at log steps).
  void addStats(const std::string &phase,
                const std::vector<std::pair<std::string, at::Tensor>> &stats);
  /// After step `done - 1`: records its time; at a log point writes the losses to the history,
  /// averages each phase's losses over the interval and over every rank (one small
  /// all-reduce, every rank takes part), and rank 0 appends them to stats.jsonl and prints the
  /// progress line (with each phase's skipped steps). `images`: the real images this rank staged in
  /// the step. A loss that is not finite stops training (a runtime failure naming the phase, step
  /// and rank) unless the phase skips non-finite steps.
  Status endStep(int64_t done, int64_t images);
  /// Before a checkpoint of `done` steps (every rank takes part): between log steps, the losses
  /// since the last one are written to the history and the interval so far, summed over the
  /// ranks, goes to session.logInterval (the checkpoint keeps it); at a log step it is empty.
  Status beforeCheckpoint(int64_t done);
  /// Rank 0: one evaluation of the --metrics at step `done` (in --metrics order), which took
  /// `seconds`; `best` where it ranks this step's snapshot the best so far. A record in
  /// stats.jsonl (`Metrics/<name>`, which TensorBoard shows), one in metrics.jsonl, a line.
  void addMetrics(int64_t done, const std::vector<std::pair<std::string, double>> &values,
                  double seconds, bool best);
  /// Writes timing.json and summary.json (rank 0), after waiting for the device time of the
  /// last steps, and lets the TensorBoard writer finish.
  Status finish();

private:
  using Clock = std::chrono::steady_clock;
  Status writeSummary(double wallSeconds) const;
  /// After a resume: the interval the checkpoint cut, as rank 0's (every rank names the same
  /// logged values, with nothing counted elsewhere).
  void restoreInterval(const std::string &json);
  Status writeProfile() const;
  /// The kernel trace failed: the reason goes to timing.json and a warning, training goes on.
  void traceFailed(const std::string &why);
  /// Ends the --kernel-time window (after the run's last step): its numbers become
  /// timing.json's kernel_time; rank 0 writes the trace file, if one was asked for.
  void stopTrace();
  struct PhaseProfile {
    int64_t runs = 0; // every run, timed or not (a GPU times replays, not warm-ups)
    std::vector<double> backward, reduced, step;
    std::vector<std::vector<double>> ready;          // per bucket
    std::vector<std::vector<double>> parameterReady; // per used parameter
  };
  std::map<std::string, PhaseProfile> profile_;
  Session &session_;
  int64_t firstStep_;
  std::ofstream history_;
  struct PendingLoss {
    int64_t step;
    std::string phase;
    at::Tensor loss;
  };
  std::vector<PendingLoss> pending_;
  std::map<std::string, double> lastLoss_;
  /// Per phase, the interval's finite losses on this rank: count, sum, sum of squares.
  struct Moments {
    double count = 0, sum = 0, squares = 0;
    /// Counts `value` if it is finite.
    void add(double value) {
      if (!std::isfinite(value))
        return;
      count += 1;
      sum += value;
      squares += value * value;
    }
  };
  std::map<std::string, Moments> interval_;
  /// Per phase and name, the interval's finite logged values on this rank.
  std::map<std::string, std::map<std::string, Moments>> statsInterval_;
  struct PendingStat {
    std::string phase, name;
    at::Tensor value;
  };
  std::vector<PendingStat> pendingStats_;
  /// endStep's parts at a log step: the pending losses and logged values read (a non-finite
  /// loss stops the run), the interval's moments all-reduced over the ranks, rank 0's line.
  Status drainPending();
  Expected<std::vector<double>>
  reduceInterval(int64_t done, const std::map<std::string, std::map<std::string, Moments>> &stats);
  void logLine(int64_t done, const std::vector<double> &moments,
               const std::map<std::string, std::map<std::string, Moments>> &stats);
  /// The last logged means over ranks and interval (summary.json).
  std::map<std::string, double> loggedMean_;
  std::ofstream stats_, metrics_;
  std::unique_ptr<EventWriter> events_;
  /// Every rank's images since the last log line, and in this run (after a resume: since it).
  int64_t imagesSinceLog_ = 0, imagesThisRun_ = 0;
  size_t stepsAtLog_ = 0;
  Clock::time_point start_, lastLog_, stepStart_, phaseStart_;
  /// With --tick-kimg, the head of a progress line as train.py writes it.
  std::string tickLine(int64_t done, double seconds) const;
  double stepWork_ = 0;
  backend::PhaseTimer timer_;
  /// --kernel-time: the profiler over the run's last steps, its result (JSON) or why not.
  std::unique_ptr<backend::KernelTrace> trace_;
  nlohmann::json kernelTime_;
  int64_t traceSteps_ = 0;
  std::vector<double> stepSeconds_, workSeconds_, runHostSeconds_, replayHostSeconds_,
      replayLaunchSeconds_;
  /// Per phase run, in order (the PhaseTimer's index): its step (from this run's first), its
  /// phase (an index into phaseKeys_: a long run keeps millions of these), whether it was a
  /// replay, and the executor's host work (the work on CPU).
  struct PhaseRun {
    size_t step;
    uint16_t phase;
    bool replayed;
    double hostWork;
  };
  std::vector<PhaseRun> runs_;
  std::vector<std::string> phaseKeys_;
  /// timing.json's `phases`: per phase, its runs and the medians of its steady ones.
  nlohmann::json phaseTimes(const std::vector<double> &deviceSeconds) const;
};

} // namespace ganc::runtime
