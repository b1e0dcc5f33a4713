// The TensorBoard writer process.
#include "runtime/rundir/TensorBoard.h"
#include "support/PythonCommand.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace ganc::runtime {

std::unique_ptr<EventWriter> EventWriter::start(const std::string &outDir, int64_t resumedStep) {
  const char *python = support::python();
  int fds[2];
  if (::pipe(fds) != 0) {
    std::cerr << "ganc: warning: no TensorBoard events: cannot create a pipe" << std::endl;
    return nullptr;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<std::string> args = {python, "-m", "ganc.tensorboard", outDir, "--follow"};
  if (resumedStep > 0) {
    args.emplace_back("--after-step");
    args.push_back(std::to_string(resumedStep));
  }
  std::vector<char *> argv;
  for (std::string &a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int error = posix_spawnp(&pid, python, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[0]);
  if (error != 0) {
    ::close(fds[1]);
    std::cerr << "ganc: warning: no TensorBoard events: cannot start " << python << " ("
              << std::strerror(error) << "; set GANC_PYTHON, or --tensorboard off)" << std::endl;
    return nullptr;
  }
  return std::unique_ptr<EventWriter>(new EventWriter(pid, fds[1]));
}

void EventWriter::finish(int timeoutSeconds) {
  if (pipe_ >= 0) {
    ::close(pipe_);
    pipe_ = -1;
  }
  if (pid_ <= 0)
    return;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << "ganc: warning: the TensorBoard writer did not finish within " << timeoutSeconds
                << " s; stopped" << std::endl;
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  pid_ = -1;
}

bool EventWriter::alive(std::string &how) {
  if (pid_ <= 0)
    return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_)
    return true;
  pid_ = -1;
  how = WIFSIGNALED(status) ? std::string("killed by ") + strsignal(WTERMSIG(status))
                            : "exited with code " + std::to_string(WEXITSTATUS(status));
  return false;
}

EventWriter::~EventWriter() { finish(10); }

} // namespace ganc::runtime
