// `ganc metrics`: its options, parsed into the runtime's ScoreOptions.
#include "tools/MetricsCommand.h"

#include "runtime/dist/Launcher.h"
#include "runtime/metrics/Metrics.h"
#include "runtime/metrics/Scoring.h"

#include <c10/util/Logging.h>

#include <cstdlib>
#include <iostream>
#include <optional>

namespace ganc::tools {

using runtime::ScoreOptions;

void appendMetricNames(const std::string &value, std::vector<std::string> &out) {
  size_t begin = 0;
  while (begin <= value.size()) {
    const size_t comma = value.find(',', begin);
    const std::string name = value.substr(begin, comma - begin);
    if (auto metric = runtime::parseMetric(name); !metric)
      throw OptionError(metric.status().message());
    out.push_back(name);
    if (comma == std::string::npos)
      break;
    begin = comma + 1;
  }
}

namespace {

struct MetricsArgs {
  ScoreOptions score;
  std::optional<int64_t> nproc;
  bool help = false;
};

const Command<MetricsArgs> &metricsTable() {
  using S = const std::string;
  using M = MetricsArgs;
  static const Command<MetricsArgs> command = {
      {"ganc metrics",
       {"RUN_DIR|CHECKPOINT --metrics fid50k[,kid50k] [options]"},
       "Scores a run's snapshot (RUN_DIR's checkpoint.pt, or a checkpoint such as "
       "checkpoint-best.pt) as training does: the generator the sample grid calls (G_ema where "
       "the spec keeps one) against the data set, with the plan, archive and data its run.json "
       "records. Ranks come from torchrun's variables, or --nproc starts local ones.",
       {},
       ""},
      {{"--metrics", "fid50k,kid50k", "the metrics, as for ganc train --metrics",
        [](S &, S &v, M &m) { appendMetricNames(v, m.score.metrics); }},
       {"--inception", "PATH",
        "the feature network (default $GANC_INCEPTION, else "
        "~/.cache/ganc/inception-2015-12-05.pt)",
        [](S &, S &v, M &m) { m.score.inception = v; }},
       {"--data", "PATH", "the real images, instead of run.json's",
        [](S &, S &v, M &m) { m.score.data = v; }},
       {"--plan", "PLAN", "the plan, instead of run.json's",
        [](S &, S &v, M &m) { m.score.plan = v; }},
       {"--model", "MODEL.pt", "the archive, instead of run.json's",
        [](S &, S &v, M &m) { m.score.model = v; }},
       {"--device", "cpu|cuda", "where to run, instead of run.json's",
        [](S &, S &v, M &m) { m.score.device = v; }},
       {"--nproc", "N", "local ranks to share the images out to (default 1)",
        [](S &f, S &v, M &m) { m.nproc = integerIn(f, v, 1, 1024); }},
       {"--threads", "N", "intra-op threads per rank",
        [](S &f, S &v, M &m) { m.score.threads = static_cast<int>(integerIn(f, v, 1, 4096)); }},
       {"--json", "", "the results as one JSON object",
        [](S &, S &, M &m) { m.score.json = true; }}},
      [](const std::string &argument, MetricsArgs &m) {
        if (!m.score.target.empty())
          throw OptionError("unexpected argument '" + argument + "'");
        m.score.target = argument;
      }};
  return command;
}

} // namespace

CommandDoc metricsCommandDoc() { return metricsTable().documented(); }

int metricsCommand(const std::string &self, const std::vector<std::string> &args) {
  MetricsArgs m;
  if (Status s = metricsTable().parse(args, m, m.help); !s) {
    std::cerr << "ganc: error: metrics: " << s.message() << std::endl;
    return 2;
  }
  if (m.help) {
    std::cout << metricsCommandDoc().usage();
    return 0;
  }
  if (m.score.target.empty() || m.score.metrics.empty()) {
    std::cerr << "ganc: error: metrics: usage: ganc metrics RUN_DIR|CHECKPOINT --metrics fid50k"
              << std::endl;
    return 2;
  }
  if (m.nproc && *m.nproc > 1) {
    std::vector<std::string> rest;
    for (size_t i = 0; i < args.size(); ++i) // every argument but --nproc N
      if (args[i] == "--nproc")
        ++i;
      else if (args[i].rfind("--nproc=", 0) != 0)
        rest.push_back(args[i]);
    return runtime::launchLocalRanks(self, static_cast<int>(*m.nproc), rest, "metrics");
  }
  if (!std::getenv("TORCH_CPP_LOG_LEVEL"))
    FLAGS_caffe2_log_level = 3;
  Status status = runtime::scoreSnapshot(m.score);
  if (!status)
    std::cerr << "ganc: error: " << status.message() << std::endl;
  return status.exitCode();
}

} // namespace ganc::tools
