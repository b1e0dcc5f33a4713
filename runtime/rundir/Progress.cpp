// Loss history, progress lines and timing.json.
#include "runtime/rundir/Progress.h"

#include "support/Files.h"
#include "support/TextFormat.h"
#include "support/torch/Collectives.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace ganc::runtime {

namespace {

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void writeList(std::ostream &out, const std::vector<double> &v) {
  out << "[";
  for (size_t i = 0; i < v.size(); ++i)
    out << (i ? ", " : "") << v[i];
  out << "]";
}

} // namespace

Progress::Progress(Session &session, int64_t firstStep)
    : session_(session), firstStep_(firstStep), timer_(session.device) {
  start_ = lastLog_ = Clock::now();
  if (session.isRankZero()) {
    std::string path = session.options.outDir + "/loss_history.csv";
    bool fresh = session.options.resume.empty() || !std::filesystem::exists(path);
    history_.open(path, fresh ? std::ios::trunc : std::ios::app);
    if (fresh)
      history_ << "step,phase,loss\n";
    stats_.open(session.options.outDir + "/stats.jsonl", fresh ? std::ios::trunc : std::ios::app);
    if (!session.options.metrics.empty())
      metrics_.open(session.options.outDir + "/metrics.jsonl",
                    fresh ? std::ios::trunc : std::ios::app);
    if (session.options.tensorboard)
      events_ = EventWriter::start(session.options.outDir, fresh ? 0 : firstStep);
  }
  if (!session.logInterval.empty())
    restoreInterval(session.logInterval);
  if (session.options.kernelTimeSteps > 0) {
    try {
      trace_ = std::make_unique<backend::KernelTrace>();
    } catch (const std::exception &e) {
      traceFailed(e.what());
    }
  }
}

void Progress::addMetrics(int64_t done, const std::vector<std::pair<std::string, double>> &values,
                          double seconds, bool best) {
  if (!session_.isRankZero())
    return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double kimg = static_cast<double>(session_.imagesSeen) / 1000.0;
  nlohmann::ordered_json record = {{"step", done}, {"timestamp", now}};
  nlohmann::ordered_json results = nlohmann::ordered_json::object();
  std::ostringstream line;
  line << "metrics at step " << done << " (" << kimg << " kimg):";
  for (const auto &[name, value] : values) {
    record["Metrics/" + name] = value;
    results[name] = value;
    char text[64];
    std::snprintf(text, sizeof(text), "  %s %.6g", name.c_str(), value);
    line << text;
  }
  stats_ << record.dump() << std::endl;
  nlohmann::ordered_json entry = {{"step", done},       {"kimg", kimg},     {"results", results},
                                  {"seconds", seconds}, {"timestamp", now}, {"best", best}};
  metrics_ << entry.dump() << std::endl;
  char time[32];
  std::snprintf(time, sizeof(time), " (%.1f s)", seconds);
  std::cout << line.str() << time << (best ? ", the best so far: checkpoint-best.pt" : "")
            << std::endl;
}

void Progress::traceFailed(const std::string &why) {
  std::string line = why.substr(0, why.find('\n'));
  kernelTime_ = {{"error", line}};
  trace_.reset();
  if (session_.isRankZero())
    std::cerr << "ganc: warning: --kernel-time: the CUDA profiler failed (" << line
              << "); training goes on, timing.json has no kernel time" << std::endl;
}

void Progress::beginStep() {
  const int64_t step = firstStep_ + static_cast<int64_t>(stepSeconds_.size());
  const TrainOptions &o = session_.options;
  if (trace_ && !trace_->running() && step == std::max(firstStep_, o.steps - o.kernelTimeSteps)) {
    try {
      trace_->start();
      traceSteps_ = o.steps - step;
    } catch (const std::exception &e) {
      traceFailed(e.what());
    }
  }
  stepStart_ = Clock::now();
  stepWork_ = 0;
}

void Progress::beginPhase() {
  phaseStart_ = Clock::now();
  timer_.begin();
}

void Progress::endPhase(int64_t step, const std::string &key, const backend::RunStats &run,
                        double hostWorkSeconds) {
  double host = secondsSince(phaseStart_);
  timer_.end(runs_.size());
  auto known = std::find(phaseKeys_.begin(), phaseKeys_.end(), key);
  if (known == phaseKeys_.end())
    known = phaseKeys_.insert(phaseKeys_.end(), key);
  runs_.push_back({static_cast<size_t>(step - firstStep_),
                   static_cast<uint16_t>(known - phaseKeys_.begin()), run.replayed,
                   hostWorkSeconds});
  stepWork_ += hostWorkSeconds;
  runHostSeconds_.push_back(host);
  if (run.replayed) {
    replayHostSeconds_.push_back(host);
    replayLaunchSeconds_.push_back(run.launchSeconds);
  }
}

void Progress::addProfile(const std::string &key, const backend::RunStats &run) {
  PhaseProfile &p = profile_[key];
  ++p.runs;
  if (!run.profiled)
    return;
  p.backward.push_back(run.backwardSeconds);
  p.reduced.push_back(run.reducedSeconds);
  p.step.push_back(run.stepSeconds);
  p.ready.resize(run.bucketReadySeconds.size());
  for (size_t b = 0; b < run.bucketReadySeconds.size(); ++b)
    p.ready[b].push_back(run.bucketReadySeconds[b]);
  p.parameterReady.resize(run.parameterReadySeconds.size());
  for (size_t i = 0; i < run.parameterReadySeconds.size(); ++i)
    p.parameterReady[i].push_back(run.parameterReadySeconds[i]);
}

namespace {

/// The median of `values` after the first runs (warm-up: allocator, first optimizer state).
double steadyMedian(std::vector<double> values) {
  const size_t skip = values.size() > 4 ? values.size() / 5 : 0;
  values.erase(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(skip));
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

} // namespace

/// The --profile file: what `ganc simulate` predicts other world sizes from.
Status Progress::writeProfile() const {
  const TrainOptions &o = session_.options;
  nlohmann::json phases = nlohmann::json::array();
  for (const auto &[key, p] : profile_) {
    if (p.backward.empty())
      continue; // never timed: no replay yet
    const ir::Phase *planned = session_.plan->findPhase(key);
    nlohmann::json buckets = nlohmann::json::array();
    for (size_t b = 0; b < p.ready.size(); ++b)
      buckets.push_back(
          {{"bytes", planned->buckets[b].bytes}, {"ready_seconds", steadyMedian(p.ready[b])}});
    // Each used parameter's gradient: what `ganc compile --bucket-cap-mb auto` re-buckets.
    nlohmann::json parameters = nlohmann::json::array();
    for (size_t i = 0; i < p.parameterReady.size(); ++i)
      parameters.push_back(
          {{"name", planned->used[i]}, {"ready_seconds", steadyMedian(p.parameterReady[i])}});
    phases.push_back({{"key", key},
                      {"runs", p.runs},
                      {"timed_runs", p.backward.size()},
                      {"parameters", parameters},
                      {"forward_backward_seconds", steadyMedian(p.backward)},
                      {"all_reduced_seconds", steadyMedian(p.reduced)},
                      {"optimizer_seconds", steadyMedian(p.step)},
                      {"buckets", buckets}});
  }
  nlohmann::json profile = {{"format", "ganc-profile"},
                            {"version", 1},
                            {"identity", session_.plan->identity},
                            {"world_size", session_.rank.worldSize},
                            // A sharded run's optimizer time is one shard's step and gathers.
                            {"zero", session_.sharded() ? session_.plan->zeroStage : 0},
                            {"threads", torch::get_num_threads()},
                            {"device", session_.device.is_cuda() ? "cuda" : "cpu"},
                            {"steps", o.steps - firstStep_},
                            {"phases", phases}};
  return writeFileAtomically(o.profile, profile.dump(2) + "\n");
}

void Progress::addLoss(int64_t step, const std::string &phase, const at::Tensor &loss) {
  pending_.push_back({step, phase, loss.clone()});
}

void Progress::addStats(const std::string &phase,
                        const std::vector<std::pair<std::string, at::Tensor>> &stats) {
  for (const auto &[name, value] : stats)
    pendingStats_.push_back({phase, name, value.clone()});
  // The phase's gradient norm, as a logged value without a name (GradNorm/<phase>).
  pendingStats_.push_back({phase, "", session_.gradNorms.at(phase).clone()});
}

namespace {

/// Sums `values` over every rank in place (one all-reduce on the group's device).
void allReduceSum(Session &s, std::vector<double> &values) {
  if (s.rank.worldSize == 1 || values.empty())
    return;
  std::vector<at::Tensor> reduced{
      at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(s.device)};
  waitFor(s.group.backend->allreduce(reduced));
  at::Tensor host = reduced[0].cpu();
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = host[static_cast<int64_t>(i)].item<double>();
}

nlohmann::json momentsJson(double count, double sum, double squares) {
  const double mean = sum / count;
  return {{"num", count},
          {"mean", mean},
          {"std", std::sqrt(std::max(0.0, squares / count - mean * mean))}};
}

} // namespace

void Progress::stopTrace() {
  const TrainOptions &o = session_.options;
  try {
    const backend::KernelTrace::Result r =
        trace_->stop(session_.isRankZero() ? o.kernelTraceFile : std::string());
    if (r.activities == 0)
      traceFailed("it recorded no GPU activity");
    else {
      nlohmann::json top = nlohmann::json::array();
      for (const backend::KernelTrace::Activity &a : r.top)
        top.push_back({{"name", a.name}, {"calls", a.calls}, {"seconds", a.seconds}});
      kernelTime_ = {{"steps", traceSteps_},
                     {"wall_seconds", r.wallSeconds},
                     {"busy_seconds", r.busySeconds},
                     {"gpu_activities", r.activities},
                     {"top", std::move(top)}};
      nlohmann::json gaps = nlohmann::json::array();
      const std::vector<double> &edges = backend::KernelTrace::kGapEdgesSeconds;
      for (size_t i = 0; i < r.gaps.size(); ++i)
        gaps.push_back({{"shorter_than_seconds",
                         i < edges.size() ? nlohmann::json(edges[i]) : nlohmann::json()},
                        {"count", r.gaps[i].count},
                        {"seconds", r.gaps[i].length}});
      kernelTime_["idle_gaps"] = std::move(gaps);
      if (!r.traceError.empty())
        std::cerr << "ganc: warning: --kernel-trace: " << r.traceError << std::endl;
      else if (!o.kernelTraceFile.empty() && session_.isRankZero())
        kernelTime_["trace_file"] = o.kernelTraceFile;
    }
  } catch (const std::exception &e) {
    traceFailed(e.what());
  }
}

Status Progress::endStep(int64_t done, int64_t images) {
  stepSeconds_.push_back(secondsSince(stepStart_));
  workSeconds_.push_back(stepWork_);
  // Every rank stages as many images per step as this one.
  const int64_t allRanks = images * session_.rank.worldSize;
  imagesSinceLog_ += allRanks;
  imagesThisRun_ += allRanks;
  session_.imagesSeen += allRanks;
  const TrainOptions &o = session_.options;
  if (trace_ && trace_->running() && done == o.steps)
    stopTrace();
  if (done % o.logEvery != 0 && done != o.steps)
    return Status::ok();
  GANC_TRY(drainPending());
  const std::map<std::string, std::map<std::string, Moments>> stats = std::move(statsInterval_);
  statsInterval_.clear();
  auto moments = reduceInterval(done, stats);
  interval_.clear();
  if (!moments)
    return moments.status();
  if (session_.isRankZero())
    logLine(done, *moments, stats);
  return Status::ok();
}

Status Progress::drainPending() {
  for (const PendingLoss &p : pending_) {
    lastLoss_[p.phase] = p.loss.item<double>();
    interval_[p.phase].add(lastLoss_[p.phase]);
    if (history_.is_open())
      history_ << p.step << "," << p.phase << "," << lastLoss_[p.phase] << "\n";
    // A phase with a loss scaler, or under `non_finite: skip`, leaves non-finite values to
    // its optimizer step (GradScaler's contract: the step is skipped on inf/NaN gradients).
    if (!std::isfinite(lastLoss_[p.phase]) && !session_.skipsNonFinite(p.phase)) {
      history_.flush();
      return Status::failure("rank " + std::to_string(session_.rank.rank) + ": phase '" + p.phase +
                             "', step " + std::to_string(p.step) + ": the loss is " +
                             std::to_string(lastLoss_[p.phase]) +
                             "; stopping (checkpoints written so far are left as they were)");
    }
  }
  pending_.clear();
  history_.flush(); // every logged row is on disk before the progress line says so
  for (const PendingStat &p : pendingStats_)
    statsInterval_[p.phase][p.name].add(p.value.item<double>());
  pendingStats_.clear();
  return Status::ok();
}

Expected<std::vector<double>>
Progress::reduceInterval(int64_t done,
                         const std::map<std::string, std::map<std::string, Moments>> &stats) {
  // The interval's losses, averaged over every rank: one all-reduce of (count, sum, sum of
  // squares) per phase, in the spec's phase order on every rank.
  std::vector<double> moments;
  for (const frontend::PhaseSpec &phase : session_.spec().phases) {
    const Moments &m = interval_[phase.name];
    moments.insert(moments.end(), {m.count, m.sum, m.squares});
  }
  // The logged values follow, by phase and name; every rank must log the same names (checked
  // first, with a fixed-size all-reduce of their count and a hash of their names).
  std::vector<double> signature = {0, 0};
  for (const auto &[phase, values] : stats)
    for (const auto &[name, m] : values) {
      signature[0] += 1;
      signature[1] += static_cast<double>(std::hash<std::string>()(phase + "/" + name) % 1000003);
      moments.insert(moments.end(), {m.count, m.sum, m.squares});
    }
  std::vector<double> agreed = signature;
  allReduceSum(session_, agreed);
  for (size_t i = 0; i < signature.size(); ++i)
    if (agreed[i] != signature[i] * session_.rank.worldSize)
      return Status::failure("rank " + std::to_string(session_.rank.rank) + ", step " +
                             std::to_string(done) +
                             ": the phases log different values on "
                             "different ranks; a phase must log the same names on every rank");
  allReduceSum(session_, moments);
  return moments;
}

std::string Progress::tickLine(int64_t done, double seconds) const {
  // train.py's tick line: tick, kimg, time, sec/tick, sec/kimg, cpumem, augment.
  const double kimg = static_cast<double>(session_.imagesSeen) / 1000.0;
  const double tickKimg = static_cast<double>(imagesSinceLog_) / 1000.0;
  const double total = std::chrono::duration<double>(Clock::now() - start_).count();
  char text[256];
  std::snprintf(text, sizeof(text),
                "tick %-5lld kimg %-8.1f time %-12s sec/tick %-7.1f sec/kimg %-7.2f cpumem %-6.2f",
                static_cast<long long>(done / std::max<int64_t>(1, session_.options.logEvery)),
                kimg, formatDuration(total).c_str(), seconds,
                tickKimg > 0 ? seconds / tickKimg : 0.0, residentGigabytes());
  std::string line = text;
  for (const auto &[name, controller] : session_.controllers) {
    std::snprintf(text, sizeof(text), " %s %.3f",
                  controller.spec().type == "ada" ? "augment" : name.c_str(),
                  controller.value().item<double>());
    line += text;
  }
  return line + " ";
}

void Progress::logLine(int64_t done, const std::vector<double> &moments,
                       const std::map<std::string, std::map<std::string, Moments>> &stats) {
  auto now = Clock::now();
  double seconds = std::chrono::duration<double>(now - lastLog_).count();
  // Images per second over every rank.
  const double imagesPerSecond = seconds > 0 ? static_cast<double>(imagesSinceLog_) / seconds : 0.0;
  double stepTime = 0;
  for (size_t i = stepsAtLog_; i < stepSeconds_.size(); ++i)
    stepTime += stepSeconds_[i];
  stepTime /= static_cast<double>(std::max<size_t>(1, stepSeconds_.size() - stepsAtLog_));
  stepsAtLog_ = stepSeconds_.size();

  nlohmann::json record = {
      {"step", done},
      {"timestamp",
       std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}};
  std::ostringstream line;
  if (session_.options.tickKimg > 0)
    line << tickLine(done, seconds);
  else
    line << "step " << done << "/" << session_.options.steps;
  size_t k = 0;
  for (const frontend::PhaseSpec &phase : session_.spec().phases) {
    const double count = moments[k], sum = moments[k + 1], squares = moments[k + 2];
    k += 3;
    const int64_t skipped = session_.skippedSteps.at(phase.name).item<int64_t>();
    record["Skipped/" + phase.name] = skipped;
    if (count == 0) // the phase did not run in this interval, or only with non-finite losses
      continue;
    const double mean = sum / count;
    loggedMean_[phase.name] = mean;
    record["Loss/" + phase.name] = momentsJson(count, sum, squares);
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "  %s %.4f", phase.name.c_str(), mean);
    line << buffer;
    if (skipped)
      line << " (" << skipped << " skipped)";
  }
  for (const auto &[phase, values] : stats)
    for (const auto &[name, m] : values) {
      const double count = moments[k], sum = moments[k + 1], squares = moments[k + 2];
      k += 3;
      if (count > 0)
        record[name.empty() ? "GradNorm/" + phase : "Stats/" + phase + "/" + name] =
            momentsJson(count, sum, squares);
    }
  // The learning rate each optimizer group stepped with last, and each loss scale now.
  for (const auto &[group, optimizer] : session_.optimizers)
    record["LR/" + group] = optimizer.lr();
  for (const auto &[name, scaler] : session_.lossScalers)
    record["LossScale/" + name] = scaler.scale().item<double>();
  for (const auto &[name, controller] : session_.controllers)
    record["Controller/" + name] = controller.value().item<double>();
  record["Progress/img_per_sec"] = imagesPerSecond;
  record["Progress/kimg"] = static_cast<double>(session_.imagesSeen) / 1000.0;
  record["Timing/sec_per_step"] = stepTime;
  if (session_.options.tickKimg > 0 && imagesSinceLog_ > 0) { // train.py's, per tick
    record["Progress/tick"] = done / std::max<int64_t>(1, session_.options.logEvery);
    record["Timing/total_sec"] = std::chrono::duration<double>(now - start_).count();
    record["Timing/sec_per_tick"] = seconds;
    record["Timing/sec_per_kimg"] = seconds / (static_cast<double>(imagesSinceLog_) / 1000.0);
    record["Resources/cpu_mem_gb"] = residentGigabytes();
  }
  if (stats_.is_open())
    stats_ << record.dump() << std::endl; // flushed: the TensorBoard writer follows the file
  if (std::string how; events_ && !events_->alive(how)) {
    // Exit 0 before the run ends: it had nothing to write with, and said so when it started.
    if (how != "exited with code 0")
      std::cerr << "ganc: warning: the TensorBoard writer " << how << "; TensorBoard is off for "
                << "the rest of this run, from step " << done << " (stats.jsonl goes on)"
                << std::endl;
    events_.reset();
  }
  char rate[64];
  std::snprintf(rate, sizeof(rate), "  %.1f img/s (all ranks)", imagesPerSecond);
  std::cout << line.str() << rate << std::endl;
  imagesSinceLog_ = 0;
  lastLog_ = now;
}

nlohmann::json Progress::phaseTimes(const std::vector<double> &deviceSeconds) const {
  struct Times {
    int64_t runs = 0;
    std::vector<double> work, host;
  };
  std::map<std::string, Times> byPhase;
  for (size_t i = 0; i < runs_.size(); ++i) {
    const PhaseRun &r = runs_[i];
    Times &t = byPhase[phaseKeys_[r.phase]];
    // Steady runs: on CUDA the replays (warm-ups and the capture are not), on CPU every run
    // after a phase's first (its first allocates and sets up the optimizer state).
    const bool steady = deviceSeconds.empty() ? t.runs > 0 : r.replayed;
    ++t.runs;
    if (!steady)
      continue;
    t.work.push_back(deviceSeconds.empty() ? r.hostWork : deviceSeconds[i]);
    t.host.push_back(runHostSeconds_[i]);
  }
  auto median = [](std::vector<double> v) -> nlohmann::json {
    if (v.empty())
      return nullptr;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  nlohmann::json phases = nlohmann::json::object();
  for (const auto &[key, t] : byPhase)
    phases[key] = {{"runs", t.runs},
                   {"steady_runs", t.work.size()},
                   {"work_seconds_median", median(t.work)},
                   {"host_seconds_median", median(t.host)}};
  return phases;
}

/// Per step: wall time, the work (CPU: host time in the model's forward and backward,
/// all-reduce waits and the optimizer; CUDA: the GPU time of the step's phases, read from
/// events) and the rest, which is ganc's own overhead (on CUDA, the time the GPU waited
/// for the host). Per phase run: host time; per replay: what it cost the CPU, and the part
/// of that inside the graph launch.
Status Progress::finish() {
  double wall = secondsSince(start_);
  std::vector<double> work = workSeconds_;
  std::vector<double> device;
  if (timer_.onDevice()) {
    // On the GPU the work is the phases' device time; the host only launched it.
    timer_.collect(/*wait=*/true);
    device = timer_.seconds();
    device.resize(runs_.size(), 0.0);
    work.assign(stepSeconds_.size(), 0.0);
    for (size_t i = 0; i < runs_.size(); ++i)
      if (runs_[i].step < work.size())
        work[runs_[i].step] += device[i];
  }
  if (!session_.isRankZero())
    return Status::ok();
  std::ostringstream skipped;
  for (const auto &[name, counter] : session_.skippedSteps) {
    int64_t n = counter.item<int64_t>();
    skipped << (skipped.tellp() > 0 ? ", " : "") << "\"" << name << "\": " << n;
    if (n > 0)
      std::cout << "phase '" << name << "': " << n << " optimizer step" << (n == 1 ? "" : "s")
                << " skipped (non-finite gradients)" << std::endl;
  }
  std::vector<double> overhead;
  for (size_t i = 0; i < stepSeconds_.size(); ++i)
    overhead.push_back(std::max(0.0, stepSeconds_[i] - work[i]));
  const std::string path = session_.options.outDir + "/timing.json";
  std::ofstream out(path);
  out << "{\"device\": \"" << (session_.device.is_cuda() ? "cuda" : "cpu")
      << "\", \"step_seconds\": ";
  writeList(out, stepSeconds_);
  out << ", \"work_seconds\": ";
  writeList(out, work);
  out << ", \"overhead_seconds\": ";
  writeList(out, overhead);
  out << ", \"run_host_seconds\": ";
  writeList(out, runHostSeconds_);
  out << ", \"replay_host_seconds\": ";
  writeList(out, replayHostSeconds_);
  out << ", \"replay_launch_seconds\": ";
  writeList(out, replayLaunchSeconds_);
  nlohmann::json nodes = nlohmann::json::object(), branches = nlohmann::json::object(),
                 memsets = nlohmann::json::object(), copies = nlohmann::json::object();
  for (const auto &[phase, shape] : session_.executor->graphShapes()) {
    nodes[phase] = shape.nodes;
    branches[phase] = shape.branches;
    memsets[phase] = shape.memsetsAsKernels;
    copies[phase] = shape.copiesAsKernels;
  }
  out << ", \"graph_nodes\": " << nodes.dump() << ", \"graph_branches\": " << branches.dump()
      << ", \"graph_memsets_as_kernels\": " << memsets.dump()
      << ", \"graph_copies_as_kernels\": " << copies.dump();
  out << ", \"phases\": " << phaseTimes(device).dump();
  out << ", \"kernel_time\": " << kernelTime_.dump();
  out << ", \"skipped_steps\": {" << skipped.str() << "}";
  out << ", \"wall_seconds\": " << wall << "}\n";
  if (!out)
    return Status::failure("cannot write " + path);
  GANC_TRY(writeSummary(wall));
  if (!session_.options.profile.empty())
    GANC_TRY(writeProfile());
  if (events_)
    events_->finish(); // the event files are complete when training returns
  return Status::ok();
}

/// summary.json: what `ganc.train` returns.
Status Progress::writeSummary(double wall) const {
  const TrainOptions &o = session_.options;
  nlohmann::json losses = nlohmann::json::object(), skipped = nlohmann::json::object();
  for (const auto &[name, mean] : loggedMean_)
    losses[name] = mean;
  for (const auto &[name, counter] : session_.skippedSteps)
    skipped[name] = counter.item<int64_t>();
  auto existing = [&](const std::string &name) -> nlohmann::json {
    const std::string path = o.outDir + "/" + name;
    return std::filesystem::exists(path) ? nlohmann::json(path) : nlohmann::json();
  };
  nlohmann::json summary = {
      {"name", session_.spec().name},
      {"first_step", firstStep_},
      {"steps", o.steps},
      {"world_size", session_.rank.worldSize},
      {"device", session_.device.is_cuda() ? "cuda" : "cpu"},
      {"zero", session_.sharded() ? session_.plan->zeroStage : 0},
      // Rank 0's (sharded, rank 0 holds the largest pieces).
      {"optimizer_state_bytes", session_.optimizerStateBytes()},
      {"gradient_buffer_bytes", session_.executor->gradientBufferBytes()},
      {"wall_seconds", wall},
      // Every rank's, from step 0 (a resumed run counts on); the rate is this run's.
      {"images", session_.imagesSeen},
      {"images_per_second", wall > 0 ? static_cast<double>(imagesThisRun_) / wall : 0.0},
      {"losses", losses},
      {"skipped_steps", skipped},
      {"out", o.outDir},
      {"checkpoint", existing("checkpoint.pt")},
      {"samples", existing("samples.png")},
      {"stats", existing("stats.jsonl")},
  };
  return writeFileAtomically(o.outDir + "/summary.json", summary.dump(2) + "\n");
}

} // namespace ganc::runtime
