// The one error type of ganc: a message and its kind (bad input, runtime failure, internal).
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace ganc {

/// What went wrong, which decides the exit code a driver returns.
enum class ErrorKind {
  /// The user's input is wrong: a file, a spec field, an option (exit 2). Found before
  /// anything ran.
  BadInput,
  /// Something failed while running: a rank died, a collective timed out, a phase threw
  /// (exit 1).
  Runtime,
  /// An invariant of ganc itself does not hold (exit 1, said as an internal error).
  Internal,
};

/// Success, or an error message the driver prints as one line, with its kind. Code returns
/// these instead of throwing or aborting, so every failure reaches the user in their own
/// terms.
class Status {
public:
  static Status ok() { return Status(); }
  /// Bad input (the default kind of an error).
  static Status error(std::string message) {
    return Status(std::move(message), ErrorKind::BadInput);
  }
  static Status failure(std::string message) {
    return Status(std::move(message), ErrorKind::Runtime);
  }
  static Status internal(std::string message) {
    return Status(std::move(message), ErrorKind::Internal);
  }

  bool isOk() const { return !message_.has_value(); }
  explicit operator bool() const { return isOk(); }
  ErrorKind kind() const { return kind_; }
  const std::string &message() const {
    static const std::string empty;
    return message_ ? *message_ : empty;
  }
  /// Prefixes the message with where it happened ("phase d: ..."); the kind is kept.
  Status withContext(const std::string &where) const {
    return isOk() ? *this : Status(where + ": " + *message_, kind_);
  }
  /// The same error, said to be of `kind` (an error is ok() no more or less).
  Status as(ErrorKind kind) const { return isOk() ? *this : Status(*message_, kind); }
  /// The process exit code for this status: 0, 2 for bad input, 1 otherwise.
  int exitCode() const { return isOk() ? 0 : kind_ == ErrorKind::BadInput ? 2 : 1; }

private:
  Status() = default;
  Status(std::string message, ErrorKind kind) : message_(std::move(message)), kind_(kind) {}
  std::optional<std::string> message_;
  ErrorKind kind_ = ErrorKind::BadInput;
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
