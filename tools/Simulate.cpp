// ganc simulate: per world size, each phase's forward and backward as profiled, its buckets
// all-reduced one after another on one channel, each starting once it is ready (its last
// gradient, as profiled) and the bucket before it is done — the plan's schedule — and the
// optimizer; against StyleGAN3's schedule (one flat all-reduce after backward). An
// all-reduce of B bytes over N ranks takes the faster of a ring, 2(N-1) alpha + 2(N-1)/N B /
// beta, and a double binary tree, 2 ceil(log2 N) alpha + 2 B / beta (NCCL picks between
// them the same way; beta is the bus bandwidth in NCCL's sense); collectives within a host
// use the intra-host link, larger ones are bound by the link between hosts. The batch per rank
// stays fixed (weak scaling), so the efficiency at N ranks is step(1) / step(N).
#include "tools/Simulate.h"

#include "perf/CommModel.h"
#include "perf/Profile.h"

#include "ir/Plan.h"
#include "support/Files.h"
#include "support/TextFormat.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

namespace ganc::tools {

using namespace ganc::perf;

namespace {

struct Options {
  std::string plan, profile;
  std::vector<int64_t> gpus;
  Topology topology;
  double coresPerHost = 0;
  bool json = false;
  bool help = false;
};

struct Phase {
  std::string key;
  double weight = 0; // runs per training step
  double compute = 0;
  double optimizer = 0;
  std::vector<ReadyBucket> buckets; // in the plan's all-reduce order
};

struct Schedule {
  Profile profile;
  int zeroStage = 0; // the plan's
  std::vector<Phase> phases;
};

struct Prediction {
  int64_t ranks = 1;
  double step = 0, exposed = 0, flatStep = 0, flatExposed = 0;
};

Topology &topologyOf(Options &o) { return o.topology; }

const Command<Options> &simulateTable() {
  using S = const std::string;
  static const Command<Options> command = [] {
    Command<Options> c{
        {"ganc simulate",
         {"PLAN --profile TIMING.json --gpus 1,8,64,512,1024 [options]"},
         "Predicts the step time, the communication left exposed and the scaling efficiency "
         "(batch per rank fixed) at each world size, from an unsharded `ganc train --profile` "
         "run of the plan's model (per phase: forward and backward, when each gradient was "
         "ready, the optimizer; each of the plan's buckets is ready with its last gradient, so "
         "one profile serves any caps) and an alpha-beta model of all-reduce (the faster of a "
         "ring, 2(N-1) alpha + 2(N-1)/N B/beta, and a double binary tree, 2 ceil(log2 N) alpha "
         "+ 2 B/beta). A sharded plan reduce-scatters (stage 2; (N-1) alpha + (N-1)/N B/beta), "
         "steps 1/N of the optimizer per rank and all-gathers each bucket once stepped. Beside "
         "it, StyleGAN3's schedule (one flat all-reduce after backward) on the same links.",
         {},
         "link defaults: nvlink 5 us, 300 GB/s; ib 10 us, 40 GB/s; ethernet 30 us, 10 GB/s;\n"
         "loopback 50 us, 2 GB/s."},
        {{"--profile", "TIMING.json", "the timing `ganc train --profile` wrote",
          storeText(&Options::profile)},
         {"--gpus", "N,N,...", "the world sizes to predict",
          [](S &f, S &v, Options &o) {
            o.gpus.clear();
            for (const std::string &item : listOf(v)) {
              std::optional<int64_t> n = parseInt64(item);
              if (!n || *n < 1 || *n > (1 << 24)) // as compile's --target-gpus
                throw OptionError(f + " takes world sizes from 1 to 16777216 like 1,8,64, not '" +
                                  v + "'");
              o.gpus.push_back(*n);
            }
            if (o.gpus.empty())
              throw OptionError(f + " is empty: give the world sizes to predict, like 1,8,64");
          }}},
        [](S &argument, Options &o) {
          if (!o.plan.empty())
            throw OptionError("more than one plan given ('" + o.plan + "', '" + argument + "')");
          o.plan = argument;
        }};
    for (Option<Options> &option : topologyOptions(&topologyOf))
      c.options.push_back(std::move(option));
    c.options.push_back(
        {"--cores-per-host", "C",
         "CPU ranks sharing C cores (a real number: measured throughput, as hyper-threads give "
         "less than a core each): compute slows by ranks x threads / C when that exceeds 1 "
         "(default: each rank has its own device)",
         [](S &f, S &v, Options &o) { o.coresPerHost = positive(f, v); }});
    c.options.push_back({"--json", "", "the predictions as JSON", storeTrue(&Options::json)});
    return c;
  }();
  return command;
}

Status parseArgs(const std::vector<std::string> &args, Options &o) {
  GANC_TRY(simulateTable().parse(args, o, o.help));
  if (o.help)
    return Status::ok();
  if (o.plan.empty())
    return Status::error("no PLAN given");
  if (o.profile.empty())
    return Status::error("--profile TIMING.json is needed (write one with ganc train --profile)");
  if (o.gpus.empty())
    return Status::error("--gpus is empty: give the world sizes to predict, like 1,8,64");
  return Status::ok();
}

/// The profile of `plan`'s model; each of the plan's buckets ready when its last gradient was
/// profiled, in the plan's all-reduce order (so a profile measured with other bucket caps
/// predicts this plan's).
Expected<Schedule> readSchedule(const std::string &path, const ir::Module &plan) {
  auto profile = readProfile(path, plan);
  if (!profile)
    return profile.status();
  Schedule schedule;
  schedule.profile = profile.take();
  schedule.zeroStage = plan.zeroStage;
  for (const ProfiledPhase &profiled : schedule.profile.phases) {
    const ir::Phase *planned = plan.findPhase(profiled.key); // readProfile checked it is there
    Phase phase;
    phase.key = profiled.key;
    phase.weight = static_cast<double>(profiled.runs) / static_cast<double>(schedule.profile.steps);
    phase.compute = profiled.compute;
    phase.optimizer = profiled.optimizer;
    phase.buckets = readyBuckets(*planned, profiled);
    schedule.phases.push_back(std::move(phase));
  }
  return schedule;
}

Prediction predict(const Schedule &schedule, const Options &o, int64_t ranks) {
  const Link link = o.topology.linkFor(ranks);
  // CPU ranks sharing cores: their compute stretches once the threads outnumber the cores.
  double slowdown = 1;
  if (o.coresPerHost > 0)
    slowdown = std::max(1.0, static_cast<double>(std::min(ranks, o.topology.ranksPerHost) *
                                                 schedule.profile.threads) /
                                 static_cast<double>(o.coresPerHost));
  Prediction p;
  p.ranks = ranks;
  for (const Phase &phase : schedule.phases) {
    const PhaseRun run = simulatePhase(phase.buckets, phase.compute, phase.optimizer, ranks, link,
                                       schedule.zeroStage, slowdown);
    int64_t total = 0;
    for (const ReadyBucket &b : phase.buckets)
      total += b.bytes;
    // StyleGAN3's schedule: every gradient in one all-reduce after backward, then the step.
    const double flat = allReduceSeconds(total, ranks, link);
    p.step += phase.weight * run.end;
    p.exposed += phase.weight * run.exposed;
    p.flatStep += phase.weight * (phase.compute + phase.optimizer) * slowdown + phase.weight * flat;
    p.flatExposed += phase.weight * flat;
  }
  return p;
}

/// A profile of several ranks measured its own exposed communication: set it beside the
/// model's for that world size, so the links can be checked against a real run.
void printProfiledCheck(const Schedule &schedule, const Options &o) {
  const Profile &profile = schedule.profile;
  if (profile.worldSize < 2)
    return;
  double measured = 0;
  for (const ProfiledPhase &phase : profile.phases) {
    if (phase.reduced < 0)
      return;
    measured += static_cast<double>(phase.runs) / static_cast<double>(profile.steps) *
                std::max(0.0, phase.reduced - phase.compute);
  }
  const double predicted = predict(schedule, o, profile.worldSize).exposed;
  char line[200];
  std::snprintf(line, sizeof(line),
                "the profiled run (%lld ranks) left %.3f ms exposed per step; these links "
                "predict %.3f ms\n",
                static_cast<long long>(profile.worldSize), measured * 1e3, predicted * 1e3);
  std::cout << line;
}

std::string format(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

} // namespace

CommandDoc simulateCommandDoc() { return simulateTable().documented(); }

int simulateCommand(const std::vector<std::string> &args) {
  auto fail = [](const std::string &message) {
    std::cerr << "ganc: error: simulate: " << message << "\n";
    return 2;
  };
  Options o;
  if (Status s = parseArgs(args, o); !s)
    return fail(s.message());
  if (o.help) {
    std::cout << simulateTable().documented().usage();
    return 0;
  }
  auto plan = ir::readPlan(o.plan);
  if (!plan)
    return fail(plan.status().message());
  auto schedule = readSchedule(o.profile, **plan);
  if (!schedule)
    return fail(schedule.status().message());
  const Profile *profile = &schedule->profile;
  // A phase that never ran after the warm-up (a lazy regulariser of a short run, a stage not
  // reached) has no timings: the prediction cannot hold it, and says so.
  if (const std::string untimed = untimedPhases(**plan, *profile, o.profile); !untimed.empty())
    std::cerr << "ganc: warning: simulate: " << untimed << ": the predictions leave it out"
              << std::endl;
  if (o.coresPerHost > 0 && profile->device != "cpu")
    return fail("--cores-per-host models CPU ranks sharing cores; " + o.profile +
                " was measured on " + profile->device);
  const Prediction one = predict(*schedule, o, 1);
  std::vector<Prediction> predictions;
  for (int64_t n : o.gpus)
    predictions.push_back(predict(*schedule, o, n));
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Prediction &p : predictions)
      out.push_back({{"ranks", p.ranks},
                     {"step_seconds", p.step},
                     {"exposed_seconds", p.exposed},
                     {"efficiency", one.step / p.step},
                     {"flat_step_seconds", p.flatStep},
                     {"flat_exposed_seconds", p.flatExposed},
                     {"flat_efficiency", one.flatStep / p.flatStep}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  const Topology &t = o.topology;
  const Link intra = t.linkFor(1), inter = t.linkFor(t.ranksPerHost + 1);
  std::cout << "simulated " << (*plan)->name << " from " << o.profile << " (" << profile->device
            << ", " << profile->worldSize << " rank" << (profile->worldSize == 1 ? "" : "s");
  if (profile->device == "cpu")
    std::cout << ", " << profile->threads << " thread" << (profile->threads == 1 ? "" : "s");
  std::cout << "); within a host (" << t.ranksPerHost << " ranks) " << t.intraLink << " "
            << format(intra.alpha * 1e6, 1) << " us, " << format(intra.bandwidth / 1e9, 1)
            << " GB/s; across hosts " << t.link << " " << format(inter.alpha * 1e6, 1) << " us, "
            << format(inter.bandwidth / 1e9, 1) << " GB/s\n";
  std::cout << "   ranks    step ms  exposed ms  efficiency  | flat all-reduce: step ms  exposed ms"
               "  efficiency\n";
  for (const Prediction &p : predictions) {
    char line[200];
    std::snprintf(line, sizeof(line), "%8lld %10.3f %11.3f %10.1f%%  | %25.3f %11.3f %10.1f%%\n",
                  static_cast<long long>(p.ranks), p.step * 1e3, p.exposed * 1e3,
                  100 * one.step / p.step, p.flatStep * 1e3, p.flatExposed * 1e3,
                  100 * one.flatStep / p.flatStep);
    std::cout << line;
  }
  printProfiledCheck(*schedule, o);
  return 0;
}

} // namespace ganc::tools
