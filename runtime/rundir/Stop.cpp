// SIGINT/SIGTERM handling and the ranks' agreement on the step to stop at (see Stop.h).
#include "runtime/rundir/Stop.h"

#include "support/torch/Collectives.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <csignal>

#include <unistd.h>

namespace ganc::runtime {

namespace {

volatile std::sig_atomic_t receivedSignal = 0;
int stoppedSignal = 0;

void onStopSignal(int signal, siginfo_t *info, void *) {
  // `ganc run` forwards the Ctrl-C it got as SIGINT, and a Ctrl-C at a terminal reaches the
  // ranks too: a SIGINT from the launcher (the parent) is never a second Ctrl-C.
  const bool fromLauncher = info != nullptr && info->si_pid != 0 && info->si_pid == getppid();
  if (signal == SIGINT && receivedSignal == SIGINT && !fromLauncher) {
    // A second Ctrl-C: stop now, the way SIGINT does by default.
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  if (receivedSignal == 0) // the first says why (Ctrl-C, then the launcher's SIGTERM: SIGINT)
    receivedSignal = signal;
}

} // namespace

StopSignals::StopSignals() {
  receivedSignal = 0;
  stoppedSignal = 0;
  struct sigaction action {};
  action.sa_sigaction = onStopSignal;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// The handlers stay installed once the run is over (finished, or stopped and checkpointed):
// a SIGTERM during the teardown that follows (the process group, the files) has nothing left
// to stop, and must not turn a run that ended into one killed by a signal (exit 143). A
// second Ctrl-C still ends the process at once.
StopSignals::~StopSignals() = default;

int StopSignals::received() { return receivedSignal; }
int StopSignals::stoppedBy() { return stoppedSignal; }
void StopSignals::setStoppedBy(int signal) { stoppedSignal = signal; }

int agreedStopNow(Session &session) {
  if (session.rank.worldSize == 1)
    return StopSignals::received();
  std::vector<at::Tensor> flag{
      torch::full({1}, StopSignals::received(), at::TensorOptions(session.device).dtype(at::kInt))};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  waitFor(session.group.backend->allreduce(flag, options));
  return flag[0].item<int32_t>();
}

int StopAgreement::afterStep() {
  if (session_.rank.worldSize == 1)
    return StopSignals::received();
  int agreed = 0;
  if (work_) { // the previous step's agreement
    if (ready_)
      ready_->synchronize();
    else
      waitFor(work_);
    agreed = pending_.item<int32_t>();
  }
  if (agreed != 0)
    return agreed;
  at::Tensor flag =
      torch::full({1}, StopSignals::received(), at::TensorOptions(session_.device).dtype(at::kInt));
  std::vector<at::Tensor> tensors{flag};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  work_ = session_.group.backend->allreduce(tensors, options);
  pending_ = flag;
  ready_.reset();
  if (session_.device.is_cuda()) {
    // The copy out, in stream order after the all-reduce; the event marks where it lands.
    waitFor(work_);
    pending_ = flag.to(at::TensorOptions(at::kCPU).pinned_memory(true), /*non_blocking=*/true);
    c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
    ready_.emplace(c10::DeviceType::CUDA);
    ready_->record(guard.getStream(session_.device));
  }
  return 0;
}

} // namespace ganc::runtime
