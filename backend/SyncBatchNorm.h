// Synchronised batch norm at run time: the kernel of ganc::sync_batch_norm (statistics and
// backward sums over every rank) and the process group it reduces over.
#pragma once

#include "support/Status.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace ganc::backend {

/// The process group ganc::sync_batch_norm all-reduces over (one per process; the runtime
/// sets it at start-up). Without one, or at world size 1, the op is batch norm itself.
void setSyncBatchNormGroup(c10::intrusive_ptr<c10d::Backend> group);

} // namespace ganc::backend
