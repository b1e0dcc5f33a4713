// torchrun-compatible rank discovery and the Gloo process group.
#include "runtime/dist/Distributed.h"

#include "runtime/dist/Launcher.h"

#include <fcntl.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef GANC_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cerrno>
#include <cstdlib>
#include <future>
#include <limits>
#include <memory>
#include <thread>

namespace ganc::runtime {

namespace {

Status readInt(const char *name, const char *fallback, int &out, int minimum) {
  const char *value = std::getenv(name);
  if (!value && fallback)
    value = std::getenv(fallback);
  if (!value)
    return Status::ok();
  char *end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value, &end, 10);
  if (*value == '\0' || *end != '\0' || errno == ERANGE || v < minimum ||
      v > std::numeric_limits<int>::max())
    return Status::error(std::string("environment variable ") + name + "='" + value +
                         "' is not a number from " + std::to_string(minimum) + " to " +
                         std::to_string(std::numeric_limits<int>::max()));
  out = static_cast<int>(v);
  return Status::ok();
}

} // namespace

Expected<std::string> firstSlurmHost(const std::string &nodeList) {
  // "gpu[07-09,12],cpu3" -> "gpu07"; "node1,node2" -> "node1". The first host is the prefix
  // up to '[' or ',' plus, with brackets, the first number or range start (zero-padded as
  // written).
  size_t end = nodeList.find_first_of("[,");
  std::string host = nodeList.substr(0, end);
  if (end != std::string::npos && nodeList[end] == '[') {
    size_t stop = nodeList.find_first_of("-,]", end + 1);
    if (stop == std::string::npos || stop == end + 1)
      return Status::error("SLURM_JOB_NODELIST='" + nodeList +
                           "' is not a node list ganc "
                           "can read: set MASTER_ADDR");
    host += nodeList.substr(end + 1, stop - end - 1);
  }
  if (host.empty() || host.find_first_of(" []") != std::string::npos)
    return Status::error("SLURM_JOB_NODELIST='" + nodeList +
                         "' is not a node list ganc can "
                         "read: set MASTER_ADDR");
  return host;
}

Expected<RankInfo> rankFromEnvironment() {
  RankInfo info;
  GANC_TRY(readInt("RANK", "SLURM_PROCID", info.rank, 0));
  GANC_TRY(readInt("WORLD_SIZE", "SLURM_NTASKS", info.worldSize, 1));
  GANC_TRY(readInt("LOCAL_RANK", "SLURM_LOCALID", info.localRank, 0));
  GANC_TRY(readInt("MASTER_PORT", nullptr, info.masterPort, 1));
  if (const char *addr = std::getenv("MASTER_ADDR"); addr && *addr) {
    info.masterAddr = addr;
  } else if (std::getenv("SLURM_PROCID")) {
    // Under srun without a launcher: rank 0's node is the first of the job's nodes.
    const char *nodes = std::getenv("SLURM_JOB_NODELIST");
    if (!nodes)
      nodes = std::getenv("SLURM_NODELIST");
    if (!nodes)
      return Status::error("SLURM_PROCID is set but neither MASTER_ADDR nor "
                           "SLURM_JOB_NODELIST is: set MASTER_ADDR to rank 0's host");
    auto host = firstSlurmHost(nodes);
    if (!host)
      return host.status();
    info.masterAddr = *host;
  }
  if (const char *agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
      agent && std::string(agent) == "True") {
    info.agentStore = true;
    const char *attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    info.storePrefix = std::string("/worker/attempt_") + (attempt ? attempt : "0");
  }
  if (const char *fd = std::getenv(kStoreListenFdVariable); fd && *fd && info.rank == 0) {
    info.storeListenFd = std::atoi(fd);
    // Held by this process alone: not by the helpers it starts (plots, TensorBoard).
    fcntl(info.storeListenFd, F_SETFD, FD_CLOEXEC);
  }
  if (info.rank >= info.worldSize)
    return Status::error("RANK=" + std::to_string(info.rank) +
                         " is not below WORLD_SIZE=" + std::to_string(info.worldSize));
  // A lone rank serves its own store and nobody connects to it: the OS picks a free port
  // (two runs on one machine once collided on 29500), unless MASTER_PORT names one.
  const char *port = std::getenv("MASTER_PORT");
  if (info.worldSize == 1 && !info.agentStore && (!port || !*port))
    info.masterPort = 0;
  return info;
}

namespace {

c10::intrusive_ptr<c10d::Store> connectStore(const RankInfo &rank,
                                             std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(rank.masterPort);
  // torchrun's agent already serves the store: binding a second server on its port would
  // fail (and be logged) on every launch. Like torch.distributed's env:// rendezvous, the
  // ranks join it as clients, under the restart attempt's prefix.
  options.isServer = rank.rank == 0 && !rank.agentStore;
  options.numWorkers = rank.agentStore ? std::nullopt : std::optional<std::size_t>(rank.worldSize);
  options.waitWorkers = !rank.agentStore;
  options.timeout = timeout;
  if (options.isServer && rank.storeListenFd >= 0)
    options.masterListenFd = rank.storeListenFd;
  auto store = c10::make_intrusive<c10d::TCPStore>(rank.masterAddr, options);
  if (!rank.agentStore)
    return store;
  return c10::make_intrusive<c10d::PrefixStore>(rank.storePrefix, store);
}

/// connectStore, bounded: c10d's TCPStore client waits without a deadline for a listener that
/// accepts the connection but never answers its first message (a port held by something
/// else). The connection runs on a helper thread; past `timeout` (plus a grace for a slow
/// server) the rank gives up with an error. The helper, stuck in a blocking read, is left
/// behind; the process exits soon after with that error.
c10::intrusive_ptr<c10d::Store> connectStoreWithin(const RankInfo &rank,
                                                   std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<c10::intrusive_ptr<c10d::Store>>>();
  std::future<c10::intrusive_ptr<c10d::Store>> connected = promise->get_future();
  std::thread([promise, rank, timeout] {
    try {
      promise->set_value(connectStore(rank, timeout));
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  if (connected.wait_for(timeout + std::chrono::seconds(5)) != std::future_status::ready)
    throw std::runtime_error("no answer from the rendezvous store within " +
                             std::to_string(timeout.count() / 1000) +
                             " s (--timeout-s); is something else listening on that port?");
  return connected.get();
}

/// The one line a rank says when it cannot join: it reached the store but the group did not
/// form in time (a peer never came: c10d's store wait or the server's wait for clients timed
/// out), or it could not reach the store at all.
Status joinError(const RankInfo &rank, const std::exception &e, std::chrono::milliseconds timeout) {
  std::string what = e.what();
  what = what.substr(0, what.find('\n'));
  const std::string prefix = "rank " + std::to_string(rank.rank) + ": ";
  const std::string at = rank.masterAddr + ":" + std::to_string(rank.masterPort);
  if (what.find("wait timeout") != std::string::npos ||
      what.find("waiting for clients") != std::string::npos)
    return Status::error(prefix + "the process group at " + at + " did not form within " +
                         std::to_string(timeout.count() / 1000) +
                         " s (--timeout-s): a rank never joined (" + what + ")");
  return Status::error(prefix + "cannot join the process group at " + at + " (" + what + ")");
}

} // namespace

Expected<ProcessGroup> createNcclGroup(const RankInfo &rank, std::chrono::milliseconds timeout) {
#ifdef GANC_WITH_CUDA
  ProcessGroup group;
  try {
    group.store = connectStoreWithin(rank, timeout);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    group.backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(group.store, rank.rank,
                                                                rank.worldSize, options);
  } catch (const std::exception &e) {
    return joinError(rank, e, timeout);
  }
  return group;
#else
  (void)timeout;
  return Status::error("rank " + std::to_string(rank.rank) +
                       ": this ganc was built without the CUDA backend (NCCL)");
#endif
}

Expected<ProcessGroup> createGlooGroup(const RankInfo &rank, std::chrono::milliseconds timeout) {
  ProcessGroup group;
  try {
    group.store = connectStoreWithin(rank, timeout);
    auto gloo = c10d::ProcessGroupGloo::Options::create();
    gloo->timeout = timeout;
    // Loopback rendezvous: bind Gloo to loopback too (the host name may not resolve in a
    // sandbox). Otherwise GLOO_SOCKET_IFNAME picks the interface, as in PyTorch.
    bool loopback = rank.masterAddr == "localhost" || rank.masterAddr.rfind("127.", 0) == 0;
    const char *ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifname)
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (loopback)
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    group.backend =
        c10::make_intrusive<c10d::ProcessGroupGloo>(group.store, rank.rank, rank.worldSize, gloo);
  } catch (const std::exception &e) {
    return joinError(rank, e, timeout);
  }
  return group;
}

} // namespace ganc::runtime
