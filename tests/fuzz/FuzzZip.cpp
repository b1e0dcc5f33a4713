// libFuzzer target: the zip container check that runs before LibTorch parses any checkpoint,
// data file or model archive. Whatever the bytes, it must return a Status without reading
// outside them; an archive it accepts must still be accepted once sealed.
#include "support/Files.h"

#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<char> bytes(reinterpret_cast<const char *>(data),
                          reinterpret_cast<const char *>(data) + size);
  if (!ganc::checkZipArchive(bytes))
    return 0;
  if (!ganc::checkZipArchive(ganc::sealZipArchive(bytes)))
    __builtin_trap(); // sealing broke an archive the check had accepted
  return 0;
}
