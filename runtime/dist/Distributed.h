// Rank discovery the torchrun way and c10d process-group set-up (TCPStore + Gloo/NCCL).
#pragma once

#include "support/Status.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace ganc::runtime {

/// Where this process stands: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
struct RankInfo {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500; // 0 for a lone rank without MASTER_PORT: any free port
  /// Under torchrun: its agent serves the store (TORCHELASTIC_USE_AGENT_STORE); every rank
  /// is a client, and keys live under the restart attempt's prefix.
  bool agentStore = false;
  std::string storePrefix;
  /// Rank 0 under `ganc run`: the listening socket the launcher holds for the store's port
  /// (GANC_STORE_LISTEN_FD), served as it is; -1 otherwise.
  int storeListenFd = -1;
};

/// Reads torchrun's variables (all optional for a single process; SLURM's SLURM_PROCID,
/// SLURM_NTASKS and SLURM_LOCALID are used when torchrun's are absent, and without
/// MASTER_ADDR the first host of SLURM_JOB_NODELIST serves the store).
Expected<RankInfo> rankFromEnvironment();

/// The first host of a SLURM node list ("gpu[07-09],cpu3" -> "gpu07").
Expected<std::string> firstSlurmHost(const std::string &nodeList);

/// The rendezvous store (rank 0 serves it) and the process group over it.
struct ProcessGroup {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

/// Creates the Gloo process group for CPU ranks. Collectives and the rendezvous give up
/// after `timeout` instead of hanging when a peer is gone.
Expected<ProcessGroup> createGlooGroup(const RankInfo &rank, std::chrono::milliseconds timeout);

/// Creates the NCCL process group for GPU ranks (one GPU per process, cuda:LOCAL_RANK, which
/// the caller has made the current device). Available when ganc was built with the CUDA
/// backend.
Expected<ProcessGroup> createNcclGroup(const RankInfo &rank, std::chrono::milliseconds timeout);

} // namespace ganc::runtime
