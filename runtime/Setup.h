// Set-up of one rank before it trains: plan and archive loaded and checked against each
// other, device and process group, executor, optimizers. Every error here is bad input.
#pragma once

#include "runtime/Session.h"
#include "runtime/data/Inputs.h"

namespace ganc::runtime {

/// Sets up this rank from `options` and torchrun's environment variables; the state of rank
/// 0 is broadcast to every rank.
Expected<std::unique_ptr<Session>> setUp(const TrainOptions &options);

/// setUp() and PhaseInputs::create(): a rank ready to train, or to score a snapshot.
Status setUpWithInputs(const TrainOptions &options, std::unique_ptr<Session> &session,
                       std::unique_ptr<PhaseInputs> &inputs);

} // namespace ganc::runtime
