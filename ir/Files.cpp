// Reading and atomically writing files; reading a plan.
#include "ir/Files.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

namespace ganc {

Expected<std::vector<char>> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error(path + ": cannot open");
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Status writeFileAtomically(const std::string &path, const std::vector<char> &bytes) {
  const std::string tmp = path + ".tmp";
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (out) {
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      written = static_cast<bool>(out.flush());
    }
  }
  if (!written) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::failure("cannot write " + path + " (" + reason + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::failure("cannot write " + path + " (" + reason + ")");
  }
  return Status::ok();
}

Status writeFileAtomically(const std::string &path, const std::string &text) {
  return writeFileAtomically(path, std::vector<char>(text.begin(), text.end()));
}

namespace ir {

Expected<std::unique_ptr<Module>> readPlan(const std::string &path) {
  auto bytes = readFile(path);
  if (!bytes)
    return Status::error(path + ": cannot open the plan");
  auto plan = parse(std::string(bytes->begin(), bytes->end()));
  if (!plan)
    return plan.status().withContext(path + ": not a ganc plan");
  GANC_TRY(verify(**plan).withContext(path + ": invalid plan"));
  return plan;
}

} // namespace ir
} // namespace ganc
