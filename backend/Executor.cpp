// The one place that picks a backend for a device.
#include "backend/Executor.h"

#include "backend/cpu/EagerExecutor.h"
#ifdef GANC_WITH_CUDA
#include "backend/cuda/CudaGraphExecutor.h"
#endif

namespace ganc::backend {

Expected<std::unique_ptr<PhaseExecutor>> createExecutor(const ir::Module &plan,
                                                        torch::jit::Module module,
                                                        c10::intrusive_ptr<c10d::Backend> group,
                                                        const ExecutorOptions &options) {
  if (options.device.is_cuda()) {
#ifdef GANC_WITH_CUDA
    auto executor = CudaGraphExecutor::create(plan, module, group, options);
    if (!executor)
      return executor.status();
    return std::unique_ptr<PhaseExecutor>(executor.take());
#else
    return Status::error("--device cuda: this ganc was built without the CUDA backend");
#endif
  }
  auto executor = EagerExecutor::create(plan, module, group, options);
  if (!executor)
    return executor.status();
  return std::unique_ptr<PhaseExecutor>(executor.take());
}

bool cudaAvailable() {
#ifdef GANC_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

} // namespace ganc::backend
