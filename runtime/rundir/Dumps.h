// --dump-grads: rank 0 writes every phase's inputs (CPU), its all-reduced gradients and the
// final parameters and buffers, for the parity tests against eager PyTorch.
#pragma once

#include "runtime/Session.h"

#include <vector>

namespace ganc::runtime {

/// The phase's inputs of micro-batch `micro` (CPU only: on CUDA they are made inside the
/// captured graph).
Status dumpInputs(Session &session, int64_t step, const frontend::PhaseSpec &phase, int64_t micro,
                  const std::vector<at::Tensor> &inputs);
/// The phase's all-reduced gradients, read from its bucket slots after the step (sharded:
/// gathered from every rank's pieces, so every rank calls it). Rank 0 writes.
Status dumpGradients(Session &session, int64_t step, const std::string &key,
                     const std::string &phase);
/// Every parameter and buffer after the last step.
Status dumpFinalState(Session &session);

} // namespace ganc::runtime
