// One rank's training loop. Set-up (bad input, exit 2) and training (runtime failure,
// exit 1) are separate functions; the loop reads as the algorithm.
#include "runtime/step/Trainer.h"

#include "runtime/Setup.h"
#include "runtime/data/Inputs.h"
#include "runtime/metrics/Metrics.h"
#include "runtime/rundir/Checkpoint.h"
#include "runtime/rundir/Dumps.h"
#include "runtime/rundir/Progress.h"
#include "runtime/rundir/RunDir.h"
#include "runtime/rundir/Samples.h"
#include "runtime/rundir/Stop.h"
#include "runtime/step/Ema.h"
#include "runtime/step/OptimizerStep.h"
#include "support/torch/TorchError.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <iostream>
#include <sstream>

namespace ganc::runtime {

namespace {

class Trainer {
public:
  Trainer(Session &session, PhaseInputs &inputs, Ema *ema, Metrics *metrics, int64_t firstStep)
      : s_(session), inputs_(inputs), ema_(ema), metrics_(metrics), firstStep_(firstStep) {}

  Status train() {
    const TrainOptions &o = s_.options;
    if (s_.isRankZero()) {
      std::cout << startupLine() << std::endl;
      GANC_TRY(writeRunRecord(s_, firstStep_, o.resume));
    }
    Progress progress(s_, firstStep_);
    StopAgreement stop(s_);
    for (int64_t step = firstStep_; step < o.steps; ++step) {
      progress.beginStep();
      inputs_.beginStep();
      for (auto &[group, optimizer] : s_.optimizers)
        optimizer.beginStep(step); // the step's scheduled learning rates
      const std::string stage = enterStage(step);
      std::vector<const frontend::PhaseSpec *> due;
      std::vector<std::string> keys; // of the due phases that are not sections
      for (const frontend::PhaseSpec &phase : s_.spec().phases)
        if (step % s_.recipe(phase, stage).interval == 0) {
          due.push_back(&phase);
          if (!phase.isSection())
            keys.push_back(ir::phaseKey(phase.name, stage));
        }
      // Every batch of the step is staged before its first phase: on CUDA the phases (and
      // sections) that share values are captured as one graph, which no upload may enter.
      int64_t images = 0;
      for (const frontend::PhaseSpec *phase : due)
        images += inputs_.prepare(*phase);
      s_.executor->beginStep(keys);
      std::vector<PhaseOutputs> outputs;
      for (size_t i = 0, k = 0; i < due.size(); ++i) {
        if (due[i]->isSection())
          GANC_TRY(runSection(step, *due[i], due));
        else
          GANC_TRY(runPhase(step, *due[i], keys[k++], progress, outputs));
      }
      GANC_TRY(endStep(step));
      for (const auto &[phase, key] : deferredDumps_) // runs captured until endStep
        GANC_TRY(dumpPhaseGradients(step, *phase, key));
      deferredDumps_.clear();
      // Kept once the whole step is issued: on CUDA the executor may launch a step's phases
      // together at its last run, so their outputs are read (copied) after that.
      for (const PhaseOutputs &out : outputs) {
        progress.addLoss(step, out.phase, out.loss);
        progress.addStats(out.phase, out.stats);
        for (auto &[name, controller] : s_.controllers)
          controller.observe(out.phase, out.stats);
      }
      for (auto &[name, controller] : s_.controllers) // ADA's p, after the step
        controller.endStep(step + 1, images * s_.rank.worldSize, *s_.group.backend);
      if (ema_)
        ema_->update(s_.imagesSeen); // the images before this step: progress counts them next
      const int64_t done = step + 1, imagesBefore = s_.imagesSeen;
      const bool last = done == o.steps;
      GANC_TRY(progress.endStep(done, images));
      if (o.sampleEvery > 0 && (done % o.sampleEvery == 0 || last))
        GANC_TRY(writeSamples(s_, inputs_, done, last));
      // Metrics before the step's checkpoint, which then holds the best snapshot's record.
      bool best = false;
      if (metrics_ && metrics_->due(imagesBefore, s_.imagesSeen, last))
        GANC_TRY(score(done, progress, best));
      const bool checkpointed = o.checkpointEvery > 0 && (done % o.checkpointEvery == 0 || last);
      if (checkpointed || (best && o.checkpointEvery > 0))
        GANC_TRY(progress.beforeCheckpoint(done));
      if (checkpointed)
        GANC_TRY(writeCheckpoint(s_, inputs_, done));
      if (best && o.checkpointEvery > 0)
        GANC_TRY(writeBestCheckpoint(s_, inputs_, done, checkpointed));
      if (abandonedBy_) // the ranks agreed on the stop during the evaluation
        return stopAt(done, abandonedBy_, checkpointed, progress);
      if (int signal = last ? 0 : stop.afterStep())
        return stopAt(done, signal, checkpointed, progress);
    }
    GANC_TRY(progress.finish());
    if (!o.dumpDir.empty() && s_.isRankZero())
      GANC_TRY(dumpFinalState(s_));
    return Status::ok();
  }

private:
  /// Every rank stops after step `done` (SIGINT or SIGTERM came): a checkpoint there (unless
  /// --checkpoint-every 0, or one was just written), timing.json and summary.json, one line.
  Status stopAt(int64_t done, int signal, bool checkpointed, Progress &progress) {
    const bool keep = s_.options.checkpointEvery > 0;
    if (keep && !checkpointed) {
      GANC_TRY(progress.beforeCheckpoint(done));
      GANC_TRY(writeCheckpoint(s_, inputs_, done));
    }
    GANC_TRY(progress.finish());
    StopSignals::setStoppedBy(signal);
    if (s_.isRankZero())
      std::cerr << "ganc: " << (signal == SIGINT ? "SIGINT" : "SIGTERM") << ": stopped after step "
                << done << " of " << s_.options.steps
                << (keep ? "; " + s_.options.outDir +
                               "/checkpoint.pt is at that step (--resume "
                               "auto continues from it)"
                         : "; no checkpoint (--checkpoint-every 0)")
                << std::endl;
    return Status::ok();
  }

  /// The --metrics at step `done`; `best` says the snapshot is the best so far by the first.
  Status score(int64_t done, Progress &progress, bool &best) {
    const auto start = std::chrono::steady_clock::now();
    auto values = metrics_->evaluate(done);
    if ((abandonedBy_ = metrics_->abandonedBy())) {
      if (s_.isRankZero())
        std::cout << "metrics at step " << done << ": abandoned part way ("
                  << (abandonedBy_ == SIGINT ? "SIGINT" : "SIGTERM") << "); no score is kept"
                  << std::endl;
      return Status::ok();
    }
    if (!values) { // the step's checkpoint first: the steps are kept
      if (s_.options.checkpointEvery > 0) {
        GANC_TRY(progress.beforeCheckpoint(done));
        GANC_TRY(writeCheckpoint(s_, inputs_, done));
      }
      return values.status().withContext(
          "step " + std::to_string(done) +
          (s_.options.checkpointEvery > 0 ? ", checkpoint.pt written at it" : ""));
    }
    // A score that is not a number never ranks best: a later finite one replaces it.
    const double value = values->front().second;
    best = std::isfinite(value) &&
           (s_.best.step < 0 || !std::isfinite(s_.best.value) || value < s_.best.value);
    if (best)
      s_.best = {metrics_->ranking(), value, done, s_.best.network};
    progress.addMetrics(
        done, *values,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        best && s_.options.checkpointEvery > 0);
    return Status::ok();
  }

  /// A phase run's loss and logged values (device tensors the run writes).
  struct PhaseOutputs {
    std::string phase;
    at::Tensor loss;
    std::vector<std::pair<std::string, at::Tensor>> stats;
  };

  /// One phase: inputs, forward, backward, bucketed all-reduces, optimizer step (on CUDA
  /// one replay of its captured graph, or part of the step's one launch), timed; its loss
  /// and logged values go to `outputs`, for the progress line once the step is issued.
  Status runPhase(int64_t step, const frontend::PhaseSpec &phase, const std::string &key,
                  Progress &progress, std::vector<PhaseOutputs> &outputs) {
    const bool dumping = !s_.options.dumpDir.empty() && s_.isRankZero();
    Status dumped = Status::ok();
    at::Tensor loss;
    progress.beginPhase();
    try {
      loss = s_.executor->run(
          key,
          [&](int64_t micro) {
            std::vector<at::Tensor> inputs = inputs_.make(phase, micro);
            if (dumping && !s_.device.is_cuda() && dumped)
              dumped = dumpInputs(s_, step, phase, micro, inputs);
            return inputs;
          },
          [&](const std::string &key, backend::PhaseReducer &reducer) {
            auto start = std::chrono::steady_clock::now();
            steps_.run(s_, key, reducer);
            progress.addOptimizerSeconds(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
          });
    } catch (const std::exception &e) {
      return fromException(e, ErrorKind::Runtime, "")
          .inPhase(key)
          .withContext("rank " + std::to_string(s_.rank.rank) + ", step " + std::to_string(step));
    }
    progress.endPhase(step, key, s_.executor->lastRun(), s_.executor->lastWorkSeconds());
    if (!s_.options.profile.empty())
      progress.addProfile(key, s_.executor->lastRun());
    GANC_TRY(dumped);
    if (s_.executor->lastRun().deferred)
      deferredDumps_.emplace_back(&phase, key);
    else
      GANC_TRY(dumpPhaseGradients(step, phase, key));
    outputs.push_back({phase.name, loss, s_.executor->lastStats()});
    const auto &handed = s_.executor->lastOutputs();
    for (size_t micro = 0; micro < handed.size() && !phase.outputs.empty(); ++micro)
      inputs_.keepValues(phase, static_cast<int64_t>(micro), handed[micro]);
    return Status::ok();
  }

  /// After the step's phases are issued: the executor runs what it deferred (on CUDA, a step
  /// whose phases share values is captured as one graph and runs here the first time).
  Status endStep(int64_t step) {
    try {
      s_.executor->endStep();
    } catch (const std::exception &e) {
      return fromException(e, ErrorKind::Runtime, "")
          .withContext("rank " + std::to_string(s_.rank.rank) + ", step " + std::to_string(step));
    }
    return Status::ok();
  }

  /// --dump-grads: the phase's gradients of this step (rank 0 writes them; sharded, every
  /// rank takes part in gathering them).
  Status dumpPhaseGradients(int64_t step, const frontend::PhaseSpec &phase,
                            const std::string &key) {
    if (s_.options.dumpDir.empty() || (!s_.isRankZero() && !s_.sharded()))
      return Status::ok();
    return dumpGradients(s_, step, key, phase.name);
  }

  /// A section: its method once per micro-batch, its values kept for the phases after it.
  /// It records the graph of what the due phase that takes its graph trains (if one is due).
  Status runSection(int64_t step, const frontend::PhaseSpec &section,
                    const std::vector<const frontend::PhaseSpec *> &due) {
    const ir::Phase *taker = nullptr;
    for (const frontend::PhaseSpec *phase : due)
      for (const std::string &through : phase->throughSections())
        if (through == section.name)
          taker = s_.plan->findPhase(phase->name);
    backend::SectionCall call;
    call.method = section.method;
    const PhaseRecipe recipe = s_.recipe(section);
    call.autocast = recipe.autocast;
    if (taker)
      call.records = [taker](const std::string &name) { return taker->trains(name); };
    try {
      for (int64_t micro = 0; micro < recipe.accumulate; ++micro)
        inputs_.keepValues(section, micro,
                           s_.executor->runSection(
                               call, [&](int64_t m) { return inputs_.make(section, m); }, micro));
    } catch (const std::exception &e) {
      return fromException(e, ErrorKind::Runtime, "")
          .inPhase(section.name)
          .withContext("rank " + std::to_string(s_.rank.rank) + ", step " + std::to_string(step));
    }
    return Status::ok();
  }

  /// What this run is, in one line: ranks, device and backend, steps, data, and how each
  /// phase runs (a captured CUDA Graph, or eagerly and why).
  std::string startupLine() const {
    const TrainOptions &o = s_.options;
    const bool cuda = s_.device.is_cuda();
    std::ostringstream line;
    line << "training " << s_.spec().name << ": " << s_.rank.worldSize << " rank"
         << (s_.rank.worldSize == 1 ? "" : "s") << " (" << (cuda ? "cuda, " : "cpu, ")
         << (s_.group.backend->getBackendName() == "nccl" ? "NCCL" : "Gloo")
         << (s_.sharded() ? ", optimizer state sharded: zero " + std::to_string(s_.plan->zeroStage)
                          : std::string())
         << "), steps " << firstStep_ << ".." << o.steps << ", batch " << s_.spec().batchSize
         << " per rank";
    if (const ShardedBatches *batches = inputs_.batches())
      line << ", " << batches->datasetSize()
           << (batches->datasetSize() == 1 ? " sample" : " samples");
    line << "; phases:";
    // On CUDA the phases that share values are captured with their sections as one graph,
    // unless one of them runs eagerly (then they all do) or --profile times each phase.
    std::string linkedEager = o.profile.empty() ? "" : "--profile times each phase on its own";
    for (const auto &p : s_.plan->phases)
      if (linkedEager.empty() && p->sharesValues() && !p->eagerReason.empty())
        linkedEager = "phase '" + p->name + "', which shares values with it, runs eagerly";
    const char *separator = " ";
    for (const frontend::PhaseSpec &phase : s_.spec().phases) {
      const ir::Phase *planned = nullptr;
      for (const auto &p : s_.plan->phases)
        if (p->name == phase.name && !planned)
          planned = p.get();
      line << separator << phase.name << " (";
      separator = ", ";
      const bool linked = phase.isSection() || (planned && planned->sharesValues());
      if (phase.isSection() && (!cuda || !o.cudaGraphs || !linkedEager.empty()))
        line << "section, eager";
      else if (phase.isSection())
        line << "section, captured with the phases that take its values";
      else if (!cuda)
        line << (planned && o.runsJoint(*planned, cuda) ? "joint graph, ganc's executor" : "eager");
      else if (!o.cudaGraphs)
        line << "eager, --cuda-graphs off";
      else if (planned && !planned->eagerReason.empty())
        line << "eager: " << planned->eagerReason;
      else if (linked && !linkedEager.empty())
        line << "eager: " << linkedEager;
      else if (linked)
        line << "CUDA Graph, one with the phases it shares values with";
      else if (o.launchesSteps())
        line << "CUDA Graph, one launch per step";
      else if (o.stepGraphs)
        line << "CUDA Graph; replayed one by one, as --dump-grads and --profile read each";
      else
        line << "CUDA Graph";
      line << ")";
    }
    return line.str();
  }

  /// For a progressive GAN: switches to the stage `step` falls in (its plans were all built
  /// at start-up) and sets the fade-in weight. Returns the stage's name ("" without stages).
  std::string enterStage(int64_t step) {
    const auto &stages = s_.spec().stages;
    if (!stages)
      return "";
    auto [index, begin] = stages->at(step);
    const frontend::StageSpec &stage = stages->list[index];
    if (index != stage_) {
      stage_ = index;
      frontend::setStageAttributes(s_.module(), *stages, index);
      if (s_.isRankZero())
        std::cout << "stage " << stage.name << " from step " << step
                  << (stage.fadeSteps
                          ? ", fading in over " + std::to_string(stage.fadeSteps) + " steps"
                          : std::string())
                  << std::endl;
    }
    inputs_.setFade(stages->fade(step));
    return stage.name;
  }

  Session &s_;
  OptimizerStep steps_; // the optimizers' step after each phase
  PhaseInputs &inputs_;
  /// --dump-grads of this step's phases whose runs were deferred to the executor's endStep().
  std::vector<std::pair<const frontend::PhaseSpec *, std::string>> deferredDumps_;
  Ema *ema_;
  Metrics *metrics_;
  /// The signal that stopped an evaluation part way (every rank agreed), or 0.
  int abandonedBy_ = 0;
  int64_t firstStep_;
  size_t stage_ = static_cast<size_t>(-1);
};

/// Everything before the first step: every error here is the user's input.
Status prepare(const TrainOptions &options, std::unique_ptr<Session> &session,
               std::unique_ptr<PhaseInputs> &inputs, std::unique_ptr<Ema> &ema,
               std::unique_ptr<Metrics> &metrics, int64_t &firstStep) {
  GANC_TRY(setUpWithInputs(options, session, inputs));
  ema = Ema::create(*session);
  firstStep = 0;
  if (!options.resume.empty()) {
    auto step = resumeCheckpoint(*session, *inputs, options.resume);
    if (!step)
      return step.status();
    firstStep = *step;
    if (session->isRankZero())
      GANC_TRY(truncateHistory(options.outDir, firstStep));
  }
  GANC_TRY(checkRanksStartAlike(*session, firstStep, inputs->dataDigest()));
  GANC_TRY(checkSampler(*session, *inputs));
  if (firstStep == 0)
    GANC_TRY(writeReals(*session, *inputs));
  auto scored = Metrics::create(*session, *inputs); // after the resume: its best snapshot
  if (!scored)
    return scored.status();
  metrics = scored.take();
  return Status::ok();
}

} // namespace

Status train(const TrainOptions &given) {
  // The run directory is rank 0's to claim, before any rank joins: a run already in it is
  // continued (--resume) or replaced (--force), never overwritten by accident.
  auto rank = rankFromEnvironment();
  if (!rank)
    return rank.status().as(ErrorKind::BadInput);
  if (rank->rank == 0)
    GANC_TRY(claimRunDir(given).as(ErrorKind::BadInput));
  TrainOptions options = given;
  auto resume = resolveResume(given, rank->rank == 0);
  if (!resume)
    return resume.status().as(ErrorKind::BadInput);
  options.resume = resume.take();
  if (given.resume == "auto" && options.resume.empty() && rank->rank == 0)
    std::cout << "--resume auto: no checkpoint in " << given.outDir << " yet, starting at step 0"
              << std::endl;
  std::unique_ptr<Session> session;
  std::unique_ptr<PhaseInputs> inputs;
  std::unique_ptr<Ema> ema;
  std::unique_ptr<Metrics> metrics;
  int64_t firstStep = 0;
  try {
    GANC_TRY(prepare(options, session, inputs, ema, metrics, firstStep).as(ErrorKind::BadInput));
  } catch (const std::exception &e) {
    return fromException(e, ErrorKind::BadInput, "");
  }
  try {
    StopSignals signals; // from here SIGINT and SIGTERM stop the run at a step, checkpointed
    return Trainer(*session, *inputs, ema.get(), metrics.get(), firstStep)
        .train()
        .as(ErrorKind::Runtime);
  } catch (const std::exception &e) {
    return fromException(e, ErrorKind::Runtime, "rank " + std::to_string(session->rank.rank));
  }
}

} // namespace ganc::runtime
