// `ganc run`'s local launcher.
#pragma once

#include <string>
#include <vector>

namespace ganc::runtime {

/// Set by `ganc run` for each rank: the file the rank writes its final error line to (instead
/// of stderr), so that the launcher prints each distinct error once.
constexpr const char *kErrorFileVariable = "GANC_ERROR_FILE";

/// Set by `ganc run` for rank 0: the descriptor of the store's listening socket, which the
/// launcher bound (to a port the OS picked) and kept listening from the moment it chose the port,
/// so that no other process can take the port before rank 0 serves the store on it.
constexpr const char *kStoreListenFdVariable = "GANC_STORE_LISTEN_FD";

/// Starts `nproc` local ranks of `self COMMAND ARGS...` (train, or metrics) on a free port (RANK,
/// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT set as torchrun does) and
/// waits for all of them. The first rank to fail stops the others (SIGTERM, then SIGKILL after a
/// grace period), so a dead rank never leaves its peers hanging in a collective. Returns the first
/// failing rank's exit code, or 0. The ranks' error lines are printed once each, after all
/// ranks have exited.
int launchLocalRanks(const std::string &self, int nproc, const std::vector<std::string> &args,
                     const std::string &command = "train");

} // namespace ganc::runtime
