// Stopping a run on SIGINT or SIGTERM at a step every rank agrees on, with a checkpoint there
// (Ctrl-C, a scheduler's preemption, torchrun stopping its workers), so that --resume continues
// from the step reached.
#pragma once

#include "runtime/Session.h"

#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <optional>

namespace ganc::runtime {

/// From construction, SIGINT and SIGTERM ask the run to stop instead of killing it; a second
/// SIGINT kills it (the default action), for a run that does not stop. The handlers stay for
/// the rest of the process: a signal during the teardown after the run never kills a run that
/// ended.
class StopSignals {
public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals &) = delete;
  StopSignals &operator=(const StopSignals &) = delete;
  /// The signal that asked to stop (SIGINT or SIGTERM), or 0.
  static int received();
  /// The signal a run stopped at (set by StopAgreement), or 0: the command exits 128 + it.
  static int stoppedBy();
  static void setStoppedBy(int signal);
};

/// Whether every rank stops after the step just done: one rank's signal stops them all at the
/// same step. With one rank that is the step the signal came in. With more, each step's end
/// all-reduces (max) the signal this rank received; the result is read at the next step's end,
/// once the device has passed it (an event, not a wait for the whole queue), so the host still
/// runs a step ahead of the device and the ranks stop one step after the signal.
class StopAgreement {
public:
  explicit StopAgreement(Session &session) : session_(session) {}
  /// After a step: the signal every rank stops at now, or 0 to go on.
  int afterStep();

private:
  Session &session_;
  c10::intrusive_ptr<c10d::Work> work_; // the last step's all-reduce
  at::Tensor pending_;                  // its result (on CUDA: copied to the host)
  std::optional<c10::Event> ready_;     // on CUDA: when pending_ holds it
};

/// The signal any rank received (SIGINT or SIGTERM), or 0, agreed by every rank now: a blocking
/// all-reduce (max), for long work between steps (a metrics evaluation) that stops part way.
int agreedStopNow(Session &session);

} // namespace ganc::runtime
