// `ganc metrics`: set up as training would (run.json's plan, archive and data), restore the
// snapshot, evaluate.
#include "runtime/metrics/Scoring.h"

#include "runtime/Setup.h"
#include "runtime/metrics/Metrics.h"
#include "runtime/rundir/Checkpoint.h"
#include "support/Files.h"
#include "support/Json.h"
#include "support/torch/TorchError.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>

namespace ganc::runtime {

namespace fs = std::filesystem;

namespace {

/// Training's options for the snapshot `checkpoint` of the run in `dir`: run.json's plan,
/// archive, data, device and seed, unless the command line gives them.
Expected<TrainOptions> optionsOf(const ScoreOptions &given, const std::string &dir,
                                 const std::string &checkpoint) {
  const std::string recordPath = dir + "/run.json";
  auto text = readFile(recordPath);
  if (!text)
    return Status::error("metrics: " + recordPath +
                         " cannot be read: ganc metrics takes the run's plan, model and data "
                         "from it (" +
                         text.status().message() + ")");
  auto record = parseJson(std::string(text->begin(), text->end()), recordPath);
  if (!record)
    return record.status();
  const nlohmann::json &r = *record;
  // A record of another shape is said in one line, naming the field (not a crash).
  const auto wrong = [&](const std::string &what) {
    return Status::error("metrics: " + recordPath + " is not a run record ganc wrote: " + what +
                         " (ganc metrics reads the run's plan, model, data and seed from it)");
  };
  if (!r.is_object())
    return wrong("it is not a JSON object");
  for (const char *key : {"plan", "model", "data", "device"})
    if (r.contains(key) && !r[key].is_string())
      return wrong("'" + std::string(key) + "' is not a string");
  for (const char *key : {"options", "overrides"})
    if (r.contains(key) && !r[key].is_object())
      return wrong("'" + std::string(key) + "' is not an object");
  const nlohmann::json options = r.value("options", nlohmann::json::object());
  const nlohmann::json overrides = r.value("overrides", nlohmann::json::object());
  if (options.contains("seed") && !options["seed"].is_number_unsigned())
    return wrong("'options.seed' is not a non-negative integer");
  if (overrides.contains("batch_size") && !overrides["batch_size"].is_number_integer())
    return wrong("'overrides.batch_size' is not an integer");
  auto field = [&](const std::string &given, const char *key) {
    return !given.empty() ? given : r.value(key, std::string());
  };
  TrainOptions o;
  o.plan = field(given.plan, "plan");
  o.model = field(given.model, "model");
  o.data = field(given.data, "data");
  o.device = field(given.device, "device");
  if (r.contains("op_libraries") && r["op_libraries"].is_array())
    for (const auto &library : r["op_libraries"])
      if (library.is_string())
        o.opLibraries.push_back(library.get<std::string>());
  o.seed = options.value("seed", uint64_t{0});
  o.batchSize = overrides.value("batch_size", int64_t{0});
  for (const auto &[flag, path] :
       {std::pair<const char *, std::string>{"plan", o.plan}, {"model", o.model}})
    if (path.empty() || !fs::exists(path))
      return Status::error("metrics: the run's " + std::string(flag) + " '" + path + "' (from " +
                           recordPath + ") is not there: give --" + flag + " PATH");
  o.resume = checkpoint;
  o.resumeFlag = "metrics: the checkpoint";
  // Scoring trains nothing: another --data (the real images FID compares with) or settings
  // that differ from the run's are no change to the run.
  o.acceptChanges = true;
  o.steps = std::numeric_limits<int64_t>::max();
  o.outDir = dir;
  o.tensorboard = false;
  o.checkpointEvery = 0;
  o.sampleEvery = 0;
  o.metrics = given.metrics;
  o.inception = given.inception;
  o.threads = given.threads;
  return o;
}

void printResults(const Session &s, const std::string &checkpoint, int64_t step,
                  const std::vector<std::pair<std::string, double>> &values, double seconds,
                  bool json) {
  if (!s.isRankZero())
    return;
  const double kimg = static_cast<double>(s.imagesSeen) / 1000.0;
  if (json) {
    nlohmann::ordered_json results = nlohmann::ordered_json::object();
    for (const auto &[name, value] : values)
      results[name] = value;
    nlohmann::ordered_json out = {
        {"checkpoint", checkpoint},       {"step", step},       {"kimg", kimg},
        {"world_size", s.rank.worldSize}, {"results", results}, {"seconds", seconds}};
    std::cout << out.dump() << std::endl;
    return;
  }
  std::cout << checkpoint << ": step " << step << ", " << kimg << " kimg" << std::endl;
  for (const auto &[name, value] : values) {
    char line[96];
    std::snprintf(line, sizeof(line), "%s %.6g", name.c_str(), value);
    std::cout << line << std::endl;
  }
}

} // namespace

Status scoreSnapshot(const ScoreOptions &given) {
  const bool isDir = fs::is_directory(given.target);
  const std::string checkpoint =
      isDir ? (fs::path(given.target) / "checkpoint.pt").string() : given.target;
  std::string dir = isDir ? given.target : fs::path(given.target).parent_path().string();
  if (dir.empty())
    dir = ".";
  if (!fs::exists(checkpoint))
    return Status::error("metrics: " + checkpoint +
                         " does not exist (give a run directory with a checkpoint.pt, or a "
                         "checkpoint in one)");
  auto options = optionsOf(given, dir, checkpoint);
  if (!options)
    return options.status();
  std::unique_ptr<Session> session;
  std::unique_ptr<PhaseInputs> inputs;
  std::unique_ptr<Metrics> metrics;
  int64_t step = 0;
  try {
    GANC_TRY(setUpWithInputs(*options, session, inputs));
    auto resumed = resumeCheckpoint(*session, *inputs, checkpoint, /*announce=*/false);
    if (!resumed)
      return resumed.status();
    step = *resumed;
    session->best = Session::Best(); // nothing is ranked here
    auto m = Metrics::create(*session, *inputs);
    if (!m)
      return m.status();
    metrics = m.take();
  } catch (const std::exception &e) {
    return fromException(e, ErrorKind::BadInput, "metrics");
  }
  try {
    const auto start = std::chrono::steady_clock::now();
    auto values = metrics->evaluate(step);
    if (!values)
      return values.status().as(ErrorKind::Runtime);
    printResults(*session, checkpoint, step, *values,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 given.json);
  } catch (const std::exception &e) {
    return fromException(e, ErrorKind::Runtime, "rank " + std::to_string(session->rank.rank));
  }
  return Status::ok();
}

} // namespace ganc::runtime
