#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace ganc {

/// Waits for a collective c10d issued. A synchronous one (options.asyncOp = false) may come
/// back without a Work: NCCL then ran it on the caller's current stream and has nothing to
/// wait for (torch.distributed checks `work is not None` for the same reason), so it is
/// ordered before whatever that stream runs next.
inline void waitFor(const c10::intrusive_ptr<c10d::Work> &work) {
  if (work)
    work->wait();
}

} // namespace ganc
