#include "runtime/Options.h"

namespace ganc::runtime {

const Spellings<DistBackend> &distBackendNames() {
  static const Spellings<DistBackend> names = {
      {"auto", DistBackend::Auto}, {"nccl", DistBackend::Nccl}, {"gloo", DistBackend::Gloo}};
  return names;
}
const Spellings<CommStream> &commStreamNames() {
  static const Spellings<CommStream> names = {
      {"auto", CommStream::Auto}, {"side", CommStream::Side}, {"compute", CommStream::Compute}};
  return names;
}
const Spellings<GraphNodes> &graphNodesNames() {
  static const Spellings<GraphNodes> names = {{"kernel", GraphNodes::Kernel},
                                              {"keep", GraphNodes::Keep}};
  return names;
}
const Spellings<UploadStream> &uploadStreamNames() {
  static const Spellings<UploadStream> names = {{"copy", UploadStream::Copy},
                                                {"compute", UploadStream::Compute}};
  return names;
}
const Spellings<DoubleBackward> &doubleBackwardNames() {
  static const Spellings<DoubleBackward> names = {{"filters", DoubleBackward::Filters},
                                                  {"grouped", DoubleBackward::Grouped},
                                                  {"pytorch", DoubleBackward::PyTorch}};
  return names;
}
const Spellings<PhaseExecutor> &phaseExecutorNames() {
  static const Spellings<PhaseExecutor> names = {{"auto", PhaseExecutor::Auto},
                                                 {"torchscript", PhaseExecutor::TorchScript},
                                                 {"joint", PhaseExecutor::Joint}};
  return names;
}
const Spellings<Fusion> &fusionNames() {
  static const Spellings<Fusion> names = {
      {"auto", Fusion::Auto}, {"on", Fusion::On}, {"off", Fusion::Off}};
  return names;
}
bool TrainOptions::fuses() const {
  return fusion == Fusion::On || (fusion == Fusion::Auto && device.rfind("cuda", 0) == 0);
}
bool TrainOptions::runsJoint(const ir::Phase &phase, bool cuda) const {
  if (phase.onlyJoint()) // its joint graph is its only code
    return true;
  switch (executor) {
  case PhaseExecutor::Joint:
    return true;
  case PhaseExecutor::Auto:
    return !cuda && !phase.joint.ops.empty() && phase.jointDeclined().empty();
  case PhaseExecutor::TorchScript:
    break;
  }
  return false;
}

const Spellings<MemoryFormat> &memoryFormatNames() {
  static const Spellings<MemoryFormat> names = {{"auto", MemoryFormat::Auto},
                                                {"channels_last", MemoryFormat::ChannelsLast},
                                                {"contiguous", MemoryFormat::Contiguous}};
  return names;
}

} // namespace ganc::runtime
