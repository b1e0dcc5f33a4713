// libFuzzer target: the IR text a user can hand to ganc-opt or `ganc train`. Whatever the
// bytes, parsing, verifying and running the compile pipeline must return a Status, never
// crash (AddressSanitizer and UndefinedBehaviorSanitizer watch); and a module that parses and
// verifies must print to text that parses back and prints identically.
#include "ir/Module.h"
#include "ir/Plan.h"
#include "passes/Pass.h"
#include "support/Files.h"

#include <cstdint>
#include <string>
#include <vector>

using namespace ganc;

namespace {

/// The inputs of a --split-input-file text (the lit files the corpus starts from).
std::vector<std::string> splitInput(const std::string &text) {
  std::vector<std::string> pieces(1);
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    end = end == std::string::npos ? text.size() : end + 1;
    std::string line = text.substr(begin, end - begin);
    if (line.rfind("// -----", 0) == 0)
      pieces.emplace_back();
    else
      pieces.back() += line;
    begin = end;
  }
  return pieces;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  (void)ir::checkPlanStamp(text);
  for (const std::string &piece : splitInput(text)) {
    auto module = ir::parse(piece);
    if (!module || !ir::verify(**module))
      continue;
    const std::string printed = ir::print(**module);
    auto again = ir::parse(printed);
    if (!again || ir::print(**again) != printed)
      __builtin_trap(); // the printer wrote text its own parser does not read back
    passes::PipelineOptions options;
    (void)passes::runPipeline(**module, passes::defaultPipeline(), options);
  }
  return 0;
}
