// TensorBoard event files for a run, written beside it by `python -m ganc.tensorboard`
// (torch.utils.tensorboard's SummaryWriter), which follows stats.jsonl and the sample grids
// as rank 0 writes them.
#pragma once

#include <memory>
#include <string>
#include <sys/types.h>

namespace ganc::runtime {

class EventWriter {
public:
  /// Starts the writer for the run in `outDir` with $GANC_PYTHON (else the Python ganc was
  /// configured with, else python3). nullptr, after one warning line, if it cannot start.
  static std::unique_ptr<EventWriter> start(const std::string &outDir);
  /// Tells the writer the run is over (its stdin closes) and waits for it to write what is
  /// left, at most `timeoutSeconds`.
  void finish(int timeoutSeconds = 60);
  ~EventWriter();

  EventWriter(const EventWriter &) = delete;
  EventWriter &operator=(const EventWriter &) = delete;

private:
  EventWriter(pid_t pid, int pipe) : pid_(pid), pipe_(pipe) {}
  pid_t pid_;
  int pipe_;
};

} // namespace ganc::runtime
