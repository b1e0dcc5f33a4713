// The one conversion of LibTorch's exceptions (c10::Error and the rest) into ganc's terms.
#pragma once

#include "support/Status.h"

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <vector>

namespace ganc {

/// The cause of a TorchScript interpreter failure in one line: the underlying error (the
/// traceback's last "...Error: ..." line) and where in the user's code it happened, e.g.
/// "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x1 and 3x5) (model.py:11, in
/// phase_g: return (self.discriminator(...) @ w).mean())". Empty if `text` is not one.
inline std::string interpreterCause(const std::string &text) {
  if (text.rfind("The following operation failed in the TorchScript interpreter.", 0) != 0)
    return "";
  std::vector<std::string> lines;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end == std::string::npos ? end : end - start));
    start = end == std::string::npos ? text.size() : end + 1;
  }
  auto trim = [](std::string t) {
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    return t;
  };
  std::string cause, file, code;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string line = trim(lines[i]);
    size_t colon = line.find(": ");
    if (colon != std::string::npos && colon >= 5 &&
        (line.compare(colon - 5, 5, "Error") == 0 || line.compare(colon - 4, 4, "tion") == 0) &&
        line.find(' ') > colon)
      cause = line;
    if (line.rfind("File \"", 0) == 0) {
      size_t close = line.find('"', 6);
      size_t lineNo = line.find(", line ");
      size_t in = line.find(", in ");
      if (close != std::string::npos && lineNo != std::string::npos && in != std::string::npos)
        file = line.substr(6, close - 6) + ":" + line.substr(lineNo + 7, in - lineNo - 7) +
               ", in " + line.substr(in + 5);
    }
    if (line.find("<--- HERE") != std::string::npos && i > 0)
      code = trim(lines[i - 1]);
  }
  if (cause.empty())
    return "";
  std::string where = file.empty() ? code : code.empty() ? file : file + ": " + code;
  return where.empty() ? cause : cause + " (" + where + ")";
}

/// A Gloo transport failure ("[.../gloo/transport/tcp/pair.cc:545] Read error ...: Connection
/// reset by peer. This is typically caused by ...") as what it means to a run: another rank
/// stopped, or a collective waited past --timeout-s; Gloo's own words in brackets, its source
/// path and advice dropped. Empty if `line` is not one.
inline std::string collectiveCause(const std::string &line) {
  const size_t close = line.find("] ");
  if (line.rfind("[", 0) != 0 || close == std::string::npos ||
      line.substr(0, close).find("gloo/") == std::string::npos)
    return "";
  std::string detail = line.substr(close + 2);
  const size_t advice = detail.find(". This is typically caused by");
  if (advice != std::string::npos)
    detail.erase(advice);
  if (detail.find("Timed out") != std::string::npos)
    return "a collective with the other ranks timed out (" + detail +
           "): a rank stopped or is stuck; --timeout-s sets how long ranks wait";
  for (const char *lost : {"Connection reset", "Connection closed", "Read error", "Write error",
                           "Broken pipe", "Connection refused"})
    if (detail.find(lost) != std::string::npos)
      return "the connection to another rank was lost (" + detail +
             "): that rank stopped; its own messages say why";
  return "a collective with the other ranks failed (" + detail + ")";
}

/// An exception's message in one line: for a c10::Error its message without the C++ stack
/// trace LibTorch appends; for a TorchScript interpreter failure the underlying error and
/// where in the model's code it happened (interpreterCause); for a failed collective what it
/// means (collectiveCause).
inline std::string firstLine(const std::exception &e) {
  const auto *ce = dynamic_cast<const c10::Error *>(&e);
  std::string s = ce ? ce->msg() : e.what();
  std::string cause = interpreterCause(s);
  if (!cause.empty())
    return cause;
  const size_t end = s.find('\n');
  const std::string line = end == std::string::npos ? s : s.substr(0, end);
  cause = collectiveCause(line);
  return cause.empty() ? line : cause;
}

/// A caught exception as a Status of `kind`, prefixed with `where` ("phase 'd', step 3").
inline Status fromException(const std::exception &e, ErrorKind kind, const std::string &where) {
  std::string message = where.empty() ? firstLine(e) : where + ": " + firstLine(e);
  return kind == ErrorKind::Runtime    ? Status::failure(message)
         : kind == ErrorKind::Internal ? Status::internal(message)
                                       : Status::error(message);
}

} // namespace ganc
