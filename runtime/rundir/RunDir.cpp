// The run directory: claiming it, --resume auto, run.json, checkpoint rotation.
#include "runtime/rundir/RunDir.h"

#include "ir/Plan.h"
#include "runtime/Overrides.h"
#include "runtime/Session.h"
#include "support/Files.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <regex>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace ganc::runtime {

namespace fs = std::filesystem;

namespace {

/// Names of the files a run writes into --out.
bool isRunFile(const std::string &name) {
  static const std::regex pattern(
      R"((checkpoint(-\d+|-best|-replaced)?\.pt|loss_history\.csv|stats\.jsonl|metrics\.jsonl|run\.json|)"
      R"(timing\.json|plan\.ganc|)"
      R"(summary\.json|samples(_step\d+)?\.png|events\.out\.tfevents\..*))");
  return std::regex_match(name, pattern);
}

/// The plan the run trains, written at its start (and at each resume).
constexpr const char *kTrainedPlan = "plan.ganc";

/// The hard link to a new step snapshot that becomes checkpoint.pt in one rename.
constexpr const char *kStagedSuffix = ".link";

/// Where --force keeps the replaced run's latest checkpoint until the new run writes one.
constexpr const char *kReplacedCheckpoint = "checkpoint-replaced.pt";

std::vector<fs::path> runFiles(const std::string &dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const fs::directory_entry &e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec) && isRunFile(e.path().filename().string()))
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string join(const std::vector<std::string> &names) {
  std::string out;
  for (const std::string &n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

/// The step checkpoints in `dir`, oldest first, with their steps (a name ganc would not
/// write, such as more digits than a step has, is not one of them).
std::vector<std::pair<int64_t, fs::path>> stepCheckpoints(const std::string &dir) {
  static const std::regex pattern(R"(checkpoint-(\d{1,18})\.pt)");
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const fs::directory_entry &e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, pattern))
      found.emplace_back(std::stoll(m[1].str()), e.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

/// Locks `dir` for this process's life (see claimRunDir); the descriptor is never closed.
Status lockRunDir(const std::string &dir) {
  const std::string path = dir + "/.ganc-lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::error("--out " + dir + ": cannot create " + path + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    pid.erase(std::remove(pid.begin(), pid.end(), '\n'), pid.end());
    return Status::error("--out " + dir + " is in use by another run" +
                         (pid.empty() ? std::string() : " (pid " + pid + ")") +
                         "; wait for it to end or choose another --out");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0)
    return Status::error("--out " + dir + ": cannot write " + path + ": " + std::strerror(errno));
  return Status::ok();
}

} // namespace

Status claimRunDir(const TrainOptions &o) {
  std::error_code ec;
  if (fs::exists(o.outDir, ec) && !fs::is_directory(o.outDir, ec))
    return Status::error("--out " + o.outDir + " exists and is not a directory");
  fs::create_directories(o.outDir, ec);
  if (ec)
    return Status::error("--out " + o.outDir + ": " + ec.message());
  GANC_TRY(lockRunDir(o.outDir));
  std::vector<fs::path> files =
      fs::exists(o.outDir, ec) ? runFiles(o.outDir) : std::vector<fs::path>();
  if (!files.empty() && o.resume.empty()) {
    if (!o.force) {
      std::vector<std::string> names;
      for (const fs::path &f : files)
        if (names.size() < 3)
          names.push_back(f.filename().string());
      return Status::error("--out " + o.outDir + " holds a run (" + join(names) +
                           (files.size() > 3 ? ", ..." : "") +
                           "): continue it with --resume auto, start over in it with --force, "
                           "or choose another --out");
    }
    // The earlier run's latest checkpoint stays, as checkpoint-replaced.pt, until this run
    // writes its own: a run that fails before its first checkpoint loses nothing, and
    // --resume auto never takes the replaced run's checkpoint for this one's.
    for (const fs::path &f : files) {
      const std::string name = f.filename().string();
      if (name == "checkpoint.pt")
        fs::rename(f, fs::path(o.outDir) / kReplacedCheckpoint, ec);
      else if (name != kReplacedCheckpoint)
        fs::remove(f, ec);
      if (ec)
        return Status::error("--force: cannot " +
                             std::string(name == "checkpoint.pt" ? "set aside " : "remove ") +
                             f.string() + ": " + ec.message());
    }
  }
  return Status::ok();
}

namespace {

/// Why the checkpoint at `path` is not whole, or "" where it is.
std::string damage(const fs::path &path) {
  auto bytes = readFile(path.string());
  if (!bytes)
    return bytes.status().message();
  Status zip = checkZipArchive(*bytes);
  return zip ? "" : zip.message();
}

} // namespace

Expected<std::string> resolveResume(const TrainOptions &o, bool say) {
  if (o.resume != "auto")
    return o.resume;
  const fs::path latest = fs::path(o.outDir) / "checkpoint.pt";
  std::error_code ec;
  // A hard link storeCheckpoint staged and never renamed (the run was killed in between): the
  // snapshot it links to is still there.
  fs::remove(latest.string() + kStagedSuffix, ec);
  const bool exists = fs::exists(latest, ec);
  const std::string why = exists ? damage(latest) : "";
  if (exists && why.empty())
    return latest.string();
  // The snapshots, newest written first: after a resume from an older one, a later step may
  // be another run's.
  std::vector<std::pair<fs::file_time_type, fs::path>> snapshots;
  for (const auto &[step, path] : stepCheckpoints(o.outDir))
    snapshots.emplace_back(fs::last_write_time(path, ec), path);
  std::sort(snapshots.rbegin(), snapshots.rend());
  const std::string latestWhy =
      exists ? "checkpoint.pt is damaged (" + why + ")" : std::string("checkpoint.pt is missing");
  std::string firstDamage;
  for (const auto &[time, path] : snapshots) {
    const std::string hurt = damage(path);
    if (!hurt.empty()) {
      if (firstDamage.empty())
        firstDamage = path.filename().string() + ": " + hurt;
      continue;
    }
    if (say)
      std::cout << "--resume auto: " << latestWhy << "; resuming from " << path.filename().string()
                << ", the newest whole snapshot" << std::endl;
    return path.string();
  }
  if (!exists && snapshots.empty())
    return std::string(); // a run that never wrote a checkpoint: step 0
  // Checkpoints are there and none is whole: starting over would train from step 0 and, at
  // its first checkpoints, rotate the damaged ones away. Nothing is touched.
  const size_t n = snapshots.size();
  return Status::error(
      "--resume auto: " + latestWhy +
      (n == 0 ? std::string(" and there is no step snapshot")
              : " and no step snapshot is whole (" + std::to_string(n) + " in " + o.outDir + "; " +
                    firstDamage + ")") +
      "; nothing was changed: resume from a checkpoint you trust with --resume PATH, or start "
      "over with --force");
}

Status truncateHistory(const std::string &outDir, int64_t step) {
  // loss_history.csv: a header, then "step,phase,loss"; stats.jsonl: one record per log step
  // ("step" is the steps done, so a record of step s covers steps before s: kept up to s).
  auto keep = [&](const std::string &name, bool header, auto &&before) -> Status {
    const std::string path = outDir + "/" + name;
    std::ifstream in(path);
    if (!in)
      return Status::ok();
    std::string text, line;
    for (bool first = true; std::getline(in, line); first = false)
      if ((first && header) || before(line))
        text += line + "\n";
    return writeFileAtomically(path, text);
  };
  GANC_TRY(keep("loss_history.csv", true, [&](const std::string &line) {
    return std::isdigit(static_cast<unsigned char>(line[0])) && std::stoll(line) < step;
  }));
  for (const char *name : {"stats.jsonl", "metrics.jsonl"})
    GANC_TRY(keep(name, false, [&](const std::string &line) {
      auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      return record.is_object() && record.value("step", int64_t{0}) <= step;
    }));
  return Status::ok();
}

namespace {

/// What the command line changed of the spec, as it said it.
nlohmann::json overridesOf(const TrainOptions &o) {
  using nlohmann::json;
  json overrides = json::object();
  for (const auto &[key, lr] : o.lr)
    overrides["lr"][key.empty() ? "*" : key] = lr;
  for (const auto &[key, b] : o.betas)
    overrides["betas"][key.empty() ? "*" : key] = {b.first, b.second};
  for (const auto &[key, k] : o.intervals)
    overrides["interval"][key] = k;
  if (o.batchSize > 0)
    overrides["batch_size"] = o.batchSize;
  for (const auto &[key, p] : o.precision)
    overrides["precision"][key.empty() ? "*" : key] = p;
  for (const auto &[key, k] : o.accumulate)
    overrides["accumulate"][key] = k;
  for (const auto &[key, c] : o.clip)
    overrides["clip"][key] = {{"max_norm", c.first},
                              {"norm_type", std::isinf(c.second) ? json("inf") : json(c.second)}};
  if (o.emaHalfLifeImages >= 0)
    overrides["ema_half_life_images"] = o.emaHalfLifeImages;
  return overrides;
}

} // namespace

namespace {

/// `path` made absolute: run.json is read from other directories (`ganc metrics RUN`).
std::string absolutePath(const std::string &path) {
  if (path.empty())
    return path;
  std::error_code ec;
  const fs::path whole = fs::absolute(path, ec);
  return ec ? path : whole.lexically_normal().string();
}

/// This run's segment of run.json: when and where it started and with which options.
nlohmann::json segmentRecord(const Session &s, int64_t firstStep, const std::string &resumedFrom) {
  const TrainOptions &o = s.options;
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char started[32];
  std::strftime(started, sizeof(started), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  // The option table's record column, and the backend the run used (--dist-backend auto
  // resolved).
  nlohmann::json options = o.record ? o.record(o) : nlohmann::json::object();
  options["dist_backend"] = s.group.backend->getBackendName();
  std::vector<std::string> libraries;
  for (const std::string &library : o.opLibraries)
    libraries.push_back(absolutePath(library));
  return {
      {"ganc_version", GANC_VERSION_STRING},
      {"started", started},
      {"plan", absolutePath(o.plan)},
      {"model", absolutePath(o.model)},
      {"op_libraries", libraries},
      {"data", absolutePath(o.data)},
      {"world_size", s.rank.worldSize},
      {"device", s.device.is_cuda() ? "cuda" : "cpu"},
      {"first_step", firstStep},
      {"resumed_from", resumedFrom},
      {"options", options},
      {"overrides", overridesOf(o)},
  };
}

} // namespace

Status writeRunRecord(const Session &s, int64_t firstStep, const std::string &resumedFrom) {
  using nlohmann::json;
  const std::string path = s.options.outDir + "/run.json";
  json segment = segmentRecord(s, firstStep, resumedFrom);
  if (!s.acceptedChanges.empty())
    segment["changes"] = s.acceptedChanges;
  // A resume continues the run's record: its first segment's settings stay at the top level.
  json record;
  if (!resumedFrom.empty())
    if (auto text = readFile(path)) {
      record = json::parse(text->begin(), text->end(), nullptr, /*allow_exceptions=*/false);
      if (!record.is_object() || !record.contains("spec"))
        record = json();
    }
  const bool continued = !record.is_null();
  if (!continued) {
    record = segment;
    record.erase("changes");
    record["spec"] = effectiveSpec(s.spec(), *s.plan);
  }
  if (!record.contains("segments") || !record["segments"].is_array()) {
    json first = record;
    first.erase("spec");
    first.erase("segments");
    record["segments"] = json::array({first});
  }
  if (continued)
    record["segments"].push_back(segment);
  GANC_TRY(writeFileAtomically(s.options.outDir + "/" + kTrainedPlan,
                               ir::stampPlan(ir::print(*s.plan))));
  return writeFileAtomically(path, record.dump(2) + "\n");
}

Status storeCheckpoint(const std::string &outDir, int64_t step, const std::vector<char> &bytes,
                       int64_t keep) {
  const std::string latest = outDir + "/checkpoint.pt";
  std::error_code ec;
  if (keep <= 0) {
    GANC_TRY(writeFileAtomically(latest, bytes));
    fs::remove(fs::path(outDir) / kReplacedCheckpoint, ec); // a run --force replaced
    return Status::ok();
  }
  char name[64];
  std::snprintf(name, sizeof(name), "/checkpoint-%07lld.pt", static_cast<long long>(step));
  const std::string snapshot = outDir + name;
  GANC_TRY(writeFileAtomically(snapshot, bytes));
  // checkpoint.pt becomes the new snapshot in one rename: a hard link made beside it first
  // (a copy where the file system has no hard links).
  const std::string staged = latest + kStagedSuffix;
  fs::remove(staged, ec);
  fs::create_hard_link(snapshot, staged, ec);
  if (ec) {
    GANC_TRY(writeFileAtomically(latest, bytes));
  } else {
    fs::rename(staged, latest, ec);
    if (ec) {
      std::error_code ignored;
      fs::remove(staged, ignored); // a link to the snapshot just written: nothing is lost
      return Status::failure("cannot replace " + latest + ": " + ec.message());
    }
  }
  fs::remove(fs::path(outDir) / kReplacedCheckpoint, ec); // a run --force replaced
  // This run's snapshots are those up to this step: a later one is another run's (this one
  // resumed from an older snapshot) and is left alone.
  std::vector<std::pair<int64_t, fs::path>> steps = stepCheckpoints(outDir);
  steps.erase(std::remove_if(steps.begin(), steps.end(),
                             [&](const auto &entry) { return entry.first > step; }),
              steps.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i)
    fs::remove(steps[i].second, ec); // an old snapshot left behind is harmless
  return Status::ok();
}

} // namespace ganc::runtime
