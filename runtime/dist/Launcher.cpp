// `ganc run`'s local launcher: N ranks of `ganc train` on one machine, torchrun's way.
#include "runtime/dist/Launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>
#include <utility>

namespace ganc::runtime {

namespace {

/// The store's socket: listening on a loopback port the OS picks, held from that moment until
/// rank 0 (which inherits it) serves the store on it. A port found free, closed and bound again
/// by rank 0 a second later could be taken in between by any other process on the machine (it
/// was, by a test beside another on a GPU machine: EADDRINUSE). {descriptor, port}, or {-1, 0}.
std::pair<int, int> storeSocket() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return {-1, 0};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    close(fd);
    return {-1, 0};
  }
  return {fd, ntohs(addr.sin_port)};
}

std::string describeExit(int status) {
  if (WIFEXITED(status))
    return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

/// The signal (SIGINT, SIGTERM, SIGHUP) that asked the launcher to stop, or 0.
volatile sig_atomic_t stopSignal = 0;

void onStopSignal(int signal) { stopSignal = signal; }

/// Forks rank `rank` of `nproc` and execs `ganc train` in it with torchrun's environment.
/// Returns its pid, or -1 when it could not be started.
pid_t startRank(const std::string &self, const std::string &command, int rank, int nproc, int port,
                int storeFd, const std::vector<std::string> &rest, int errorFile) {
  const pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid != 0)
    return pid;
  // A rank dies with its launcher, even one killed with SIGKILL: no orphans training on.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher)
    _exit(1);
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  if (storeFd >= 0) // rank 0 serves the store on the socket the launcher holds
    setenv(kStoreListenFdVariable, std::to_string(storeFd).c_str(), 1);
  if (errorFile >= 0) // the rank's own unlinked file, inherited: reached by its descriptor
    setenv(kErrorFileVariable, ("/proc/self/fd/" + std::to_string(errorFile)).c_str(), 1);
  std::vector<std::string> argvStrings = {self, command};
  argvStrings.insert(argvStrings.end(), rest.begin(), rest.end());
  std::vector<char *> argv;
  for (std::string &s : argvStrings)
    argv.push_back(s.data());
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  std::perror("ganc run: exec");
  _exit(127);
}

/// Waits for every rank; the first one to fail stops the others (SIGTERM, then SIGKILL after
/// a grace period), so a dead rank never leaves its peers hanging in a collective. SIGINT,
/// SIGTERM and SIGHUP to the launcher stop the ranks the same way. Returns the exit code.
int superviseRanks(const std::vector<pid_t> &children) {
  struct sigaction action {};
  action.sa_handler = onStopSignal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP})
    sigaction(signal, &action, nullptr);
  int result = 0;
  size_t alive = children.size();
  std::vector<bool> done(children.size(), false);
  std::chrono::steady_clock::time_point killDeadline{};
  // After SIGTERM a rank finishes its step and writes a checkpoint there (with its peers):
  // a minute before SIGKILL. Peers of a failed rank cannot agree with it and end sooner.
  // A stop asked by Ctrl-C (SIGINT) is forwarded as SIGINT, so that the ranks name the signal
  // the user sent; SIGTERM, SIGHUP and a failed rank as SIGTERM.
  auto stopRest = [&](std::chrono::seconds grace, int signal) {
    for (size_t i = 0; i < children.size(); ++i)
      if (!done[i])
        kill(children[i], signal);
    killDeadline = std::chrono::steady_clock::now() + grace;
  };
  bool stopping = false, everyRankFinished = true;
  while (alive > 0) {
    if (stopSignal != 0 && !stopping) {
      stopping = true;
      result = 128 + stopSignal;
      std::cerr << "ganc run: " << strsignal(stopSignal)
                << "; stopping the ranks at their next step (checkpointed)" << std::endl;
      stopRest(std::chrono::seconds(60), stopSignal == SIGINT ? SIGINT : SIGTERM);
    }
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if (killDeadline != std::chrono::steady_clock::time_point{} &&
          std::chrono::steady_clock::now() > killDeadline) {
        for (size_t i = 0; i < children.size(); ++i)
          if (!done[i])
            kill(children[i], SIGKILL);
        killDeadline = {};
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i] != pid)
        continue;
      done[i] = true;
      --alive;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      everyRankFinished = everyRankFinished && ok;
      if (!ok && result == 0 && !stopping) {
        result = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        std::cerr << "ganc run: rank " << i << " " << describeExit(status)
                  << "; stopping the other ranks" << std::endl;
        stopRest(std::chrono::seconds(10), SIGTERM);
      }
    }
  }
  // A stop that came as the ranks ended: every rank finished its steps (a stopped rank exits
  // 128 + the signal), so the run ended, and says so.
  if (stopping && everyRankFinished) {
    std::cerr << "ganc run: every rank had finished its steps; the run is complete" << std::endl;
    result = 0;
  }
  return result;
}

/// A file for one rank's error line, already unlinked: nothing is left behind however the
/// launcher ends (kill -9 included). -1 where none can be made (the rank prints its own).
int anonymousErrorFile() {
  std::string path = (std::filesystem::temp_directory_path() / "ganc-run-XXXXXX").string();
  const int fd = mkstemp(path.data());
  if (fd >= 0)
    unlink(path.c_str());
  return fd;
}

/// Prints the ranks' error lines once each: the same error from several ranks (bad input
/// every rank finds) is one line, not one per rank. Closes the files.
void reportRankErrors(const std::vector<int> &files) {
  std::vector<std::string> errors; // distinct lines, first-seen order
  for (int fd : files) {
    if (fd < 0)
      continue;
    std::string text;
    char buffer[4096];
    lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;)
      text.append(buffer, static_cast<size_t>(n));
    close(fd);
    size_t begin = 0;
    for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
      const std::string line = text.substr(begin, end - begin);
      if (std::find(errors.begin(), errors.end(), line) == errors.end())
        errors.push_back(line);
    }
  }
  for (const std::string &line : errors)
    std::cerr << "ganc: error: " << line << std::endl;
}

} // namespace

int launchLocalRanks(const std::string &self, int nproc, const std::vector<std::string> &rest,
                     const std::string &command) {
  const auto [storeFd, port] = storeSocket();
  if (storeFd < 0) {
    std::cerr << "ganc: error: run: cannot listen on a loopback port for the ranks' store ("
              << std::strerror(errno) << ")" << std::endl;
    return 2;
  }
  // Each rank writes its final error line to a file of its own; the launcher prints them once.
  std::vector<int> errorFiles;
  for (int r = 0; r < nproc; ++r)
    errorFiles.push_back(anonymousErrorFile());
  std::vector<pid_t> children;
  for (int r = 0; r < nproc; ++r) {
    pid_t pid = startRank(self, command, r, nproc, port, r == 0 ? storeFd : -1, rest,
                          errorFiles[static_cast<size_t>(r)]);
    if (r == 0) // rank 0 holds it now; the other ranks connect to the port
      close(storeFd);
    if (pid < 0) {
      std::cerr << "ganc: error: run: cannot start rank " << r << std::endl;
      for (pid_t child : children)
        kill(child, SIGTERM);
      return 2;
    }
    children.push_back(pid);
  }
  int result = superviseRanks(children);
  reportRankErrors(errorFiles);
  return result;
}

} // namespace ganc::runtime
