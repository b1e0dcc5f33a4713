// Gradient, input and final-state dumps.
#include "runtime/rundir/Dumps.h"

#include "runtime/rundir/Dict.h"

#include "support/Files.h"

#include <torch/serialize.h>

namespace ganc::runtime {

Status dumpInputs(Session &s, int64_t step, const frontend::PhaseSpec &phase, int64_t micro,
                  const std::vector<at::Tensor> &inputs) {
  c10::Dict<std::string, at::Tensor> named;
  for (size_t i = 0; i < inputs.size(); ++i)
    named.insert(phase.inputs[i].name, inputs[i].clone());
  return writeFileAtomically(s.options.dumpDir + "/inputs_step" + std::to_string(step) + "_" +
                                 phase.name + (micro ? "_micro" + std::to_string(micro) : "") +
                                 ".pt",
                             torch::pickle_save(named));
}

Status dumpGradients(Session &s, int64_t step, const std::string &key, const std::string &phase) {
  const backend::PhaseReducer &reducer = s.executor->reducer(key);
  // Sharded, each rank holds its pieces only: every rank takes part in putting them together.
  const std::vector<at::Tensor> gathered =
      reducer.zeroStage() ? reducer.gatherGradients() : std::vector<at::Tensor>();
  if (!s.isRankZero())
    return Status::ok();
  c10::Dict<std::string, at::Tensor> grads;
  for (size_t i = 0; i < reducer.usedNames().size(); ++i)
    if (reducer.hadGradient(i))
      grads.insert(reducer.usedNames()[i],
                   (gathered.empty() ? reducer.gradient(i) : gathered[i]).cpu().clone());
  return writeFileAtomically(s.options.dumpDir + "/grads_step" + std::to_string(step) + "_" +
                                 phase + ".pt",
                             torch::pickle_save(grads));
}

Status dumpFinalState(Session &s) {
  c10::Dict<std::string, at::Tensor> state;
  for (const auto &[name, p] : s.executor->parameters())
    state.insert(name, p.detach().cpu().clone());
  for (const auto &b : s.module().named_buffers(true))
    state.insert(b.name, b.value.detach().cpu().clone());
  GANC_TRY(writeFileAtomically(s.options.dumpDir + "/params_final.pt", torch::pickle_save(state)));
  if (s.lossScalers.empty())
    return Status::ok();
  // As the reference writes them: {name: {"scale": float, "growth_tracker": int}}.
  c10::impl::GenericDict scalers = makeDict();
  for (const auto &[name, scaler] : s.lossScalers) {
    c10::impl::GenericDict entry = makeDict();
    entry.insert("scale", scaler.scale().item<double>());
    entry.insert("growth_tracker",
                 scaler.stateDict().at("growth_tracker").toTensor().item<int64_t>());
    scalers.insert(name, entry);
  }
  return writeFileAtomically(s.options.dumpDir + "/loss_scalers_final.pt",
                             torch::pickle_save(scalers));
}

} // namespace ganc::runtime
