// TensorBoard event files for a run, written beside it by `python -m ganc.tensorboard`
// (torch.utils.tensorboard's SummaryWriter), which follows stats.jsonl and the sample grids
// as rank 0 writes them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <sys/types.h>

namespace ganc::runtime {

class EventWriter {
public:
  /// Starts the writer for the run in `outDir` with $GANC_PYTHON (else the Python ganc was
  /// configured with, else python3); for a run resumed at `resumedStep` (> 0) it sends only
  /// what comes after that step. nullptr, after one warning line, if it cannot start.
  static std::unique_ptr<EventWriter> start(const std::string &outDir, int64_t resumedStep = 0);
  /// Whether the writer still runs; where it has ended, `how` says how (an exit code or a
  /// signal).
  bool alive(std::string &how);
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
