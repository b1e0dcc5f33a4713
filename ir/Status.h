// The one error type of the compiler: a message, optionally located in the IR.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace ganc {

/// Success, or an error message the driver prints as one line. Compiler code returns these
/// instead of throwing or aborting, so every failure reaches the user in their own terms.
class Status {
public:
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message)); }

  bool isOk() const { return !message_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const std::string &message() const {
    static const std::string empty;
    return message_ ? *message_ : empty;
  }
  /// Prefixes the message with where it happened ("phase d: ...").
  Status withContext(const std::string &where) const {
    return isOk() ? *this : Status(where + ": " + *message_);
  }

private:
  Status() = default;
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

/// A value or the Status saying why there is none.
template <typename T> class Expected {
public:
  Expected(T value) : value_(std::move(value)), status_(Status::ok()) {}
  Expected(Status status) : status_(std::move(status)) {}

  bool isOk() const { return status_.isOk(); }
  explicit operator bool() const { return isOk(); }
  const Status &status() const { return status_; }
  T &operator*() { return *value_; }
  const T &operator*() const { return *value_; }
  T *operator->() { return &*value_; }
  const T *operator->() const { return &*value_; }
  T take() { return std::move(*value_); }

private:
  std::optional<T> value_;
  Status status_;
};

} // namespace ganc

/// Returns early from a function returning Status or Expected<T> when EXPR fails.
#define GANC_TRY(EXPR)                                                                             \
  do {                                                                                             \
    ::ganc::Status ganc_status_ = (EXPR);                                                          \
    if (!ganc_status_.isOk())                                                                      \
      return ganc_status_;                                                                         \
  } while (false)
