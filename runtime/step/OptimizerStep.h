// A phase's optimizer step, after its gradients are all-reduced: unscaled by its loss scaler,
// clipped as the plan says, each optimizer group stepped over its used parameters (sharded:
// this rank's pieces, bucket by bucket while each bucket's all-gather runs), steps with
// non-finite gradients skipped where the run says so.
#pragma once

#include "backend/Reducer.h"
#include "ir/Module.h"
#include "runtime/step/Optimizer.h"

#include <map>
#include <string>
#include <vector>

namespace ganc::runtime {

struct Session;

class OptimizerStep {
public:
  /// Clips (as the plan says) and steps the optimizers over the used parameters of phase
  /// `phase` (its key), whose reducer is `reducer`; a step whose gradients are not finite is
  /// skipped where Session::skipsNonFinite says so. Sharded, each rank steps its pieces and
  /// the reducer then all-gathers them.
  void run(Session &s, const std::string &phase, backend::PhaseReducer &reducer);

private:
  /// One optimizer's share of a phase's step: its used parameters in model order (sharded:
  /// this rank's pieces of them), and the clipping the plan asks for.
  struct StepGroup {
    Optimizer *optimizer = nullptr;
    std::vector<std::string> names;
    std::vector<at::Tensor> parameters;
    /// Each one's index in the reducer's used parameters.
    std::vector<size_t> used;
    const ir::ClipGradNorm *clip = nullptr;
    /// Sharded: the group's pieces in each bucket (positions in the vectors above), stepped
    /// bucket by bucket so each bucket's all-gather overlaps the next one's step.
    struct Part {
      std::vector<std::string> names;
      std::vector<at::Tensor> parameters;
      std::vector<size_t> positions;
    };
    std::map<int, Part> byBucket;
  };
  /// The phase's step groups, worked out on its first step and kept (a phase's used
  /// parameters never change).
  const std::vector<StepGroup> &groups(Session &s, const std::string &phase,
                                       const backend::PhaseReducer &reducer);
  /// The last run's all-reduced gradients of `group` (sharded: of its pieces); undefined
  /// where a conditional parameter got none.
  static std::vector<at::Tensor> gradients(const StepGroup &group,
                                           const backend::PhaseReducer &reducer);
  /// Sharded: every group's found-inf flag and clipping norm part, and the phase's squared
  /// gradient norm (`squares`), combined across ranks in one all-reduce (a second one, with
  /// max, for infinity norms).
  static void combineAcrossRanks(const Session &s, std::vector<at::Tensor> &found,
                                 std::vector<at::Tensor> &normParts, at::Tensor &squares,
                                 const std::vector<StepGroup> &groups);
  std::map<std::string, std::vector<StepGroup>> cache_;
};

} // namespace ganc::runtime
