// Plans on disk: the checksum line `ganc compile -o` and `ganc-opt -o` stamp a verified plan
// with, and reading one back.
#include "ir/Plan.h"
#include "support/Files.h"

#include <zlib.h>

#include <cstdio>
#include <cstring>

namespace ganc::ir {

namespace {

constexpr const char *kChecksumPrefix = "// checksum crc32 ";

std::string crcHex(const std::string &text) {
  uLong c = crc32(0L, reinterpret_cast<const Bytef *>(text.data()), static_cast<uInt>(text.size()));
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08lx", static_cast<unsigned long>(c));
  return hex;
}

} // namespace

std::string stampPlan(const std::string &text) {
  return text + kChecksumPrefix + crcHex(text) + "\n";
}

Status checkPlanStamp(const std::string &text) {
  size_t last = text.rfind(kChecksumPrefix);
  if (last == std::string::npos || (last != 0 && text[last - 1] != '\n'))
    return Status::error("the plan has no checksum line; plans are written by `ganc compile -o` "
                         "or `ganc-opt -o`, which verify them first");
  std::string body = text.substr(0, last);
  std::string stamped = text.substr(last + std::strlen(kChecksumPrefix));
  while (!stamped.empty() && (stamped.back() == '\n' || stamped.back() == '\r'))
    stamped.pop_back();
  if (stamped != crcHex(body))
    return Status::error("the plan was changed after it was written (checksum mismatch); "
                         "recompile it, or check an edited plan with `ganc-opt FILE -o FILE`");
  return Status::ok();
}

Expected<std::unique_ptr<Module>> readPlan(const std::string &path) {
  auto bytes = readFile(path);
  if (!bytes)
    return bytes.status().withContext("the plan");
  std::string text(bytes->begin(), bytes->end());
  GANC_TRY(checkPlanStamp(text).withContext(path));
  auto plan = parse(text);
  if (!plan)
    return plan.status().withContext(path + ": not a ganc plan");
  GANC_TRY(verify(**plan).withContext(path + ": invalid plan"));
  return plan;
}

} // namespace ganc::ir
