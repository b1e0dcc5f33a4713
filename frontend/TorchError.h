// The one conversion of LibTorch's exceptions (c10::Error and the rest) into ganc's terms.
#pragma once

#include "ir/Status.h"

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace ganc::frontend {

/// The first line of an exception's message: for a c10::Error its message without the C++
/// stack trace LibTorch appends.
inline std::string firstLine(const std::exception &e) {
  const auto *ce = dynamic_cast<const c10::Error *>(&e);
  std::string s = ce ? ce->msg() : e.what();
  size_t end = s.find('\n');
  return end == std::string::npos ? s : s.substr(0, end);
}

/// A caught exception as a Status of `kind`, prefixed with `where` ("phase 'd', step 3").
inline Status fromException(const std::exception &e, ErrorKind kind, const std::string &where) {
  std::string message = where.empty() ? firstLine(e) : where + ": " + firstLine(e);
  return kind == ErrorKind::Runtime    ? Status::failure(message)
         : kind == ErrorKind::Internal ? Status::internal(message)
                                       : Status::error(message);
}

} // namespace ganc::frontend
