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

/// Where an error is, in the user's terms; every part is optional. Printed before the
/// message as "file: phase 'd': op aten::conv2d: parameter 'g.w': ".
struct Location {
  std::string file;
  /// The phase key: "d", or "d@8x8" for its specialisation for a stage.
  std::string phase;
  std::string op;
  std::string parameter;

  bool empty() const { return file.empty() && phase.empty() && op.empty() && parameter.empty(); }
  std::string str() const {
    std::string s;
    auto add = [&s](const std::string &part) { s += part + ": "; };
    if (!file.empty())
      add(file);
    if (!phase.empty())
      add("phase '" + phase + "'");
    if (!op.empty())
      add("op " + op);
    if (!parameter.empty())
      add("parameter '" + parameter + "'");
    return s;
  }
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
  /// The whole line: the location, then the message ("" when ok).
  std::string message() const {
    return message_ ? context_ + location_.str() + *message_ : std::string();
  }
  /// Where the error is, as far as it is known.
  const Location &location() const { return location_; }
  /// Prefixes the message with free-form context ("rank 1: ..."); kind and location are kept,
  /// and the context comes before the location.
  Status withContext(const std::string &where) const {
    if (isOk())
      return *this;
    Status s = *this;
    s.context_ = where + ": " + context_;
    return s;
  }
  /// The same error, located in `file` / `phase` / at `op` / for `parameter`: each sets the
  /// part only where it is not known yet, so the innermost caller's location wins.
  Status inFile(const std::string &file) const { return locate(&Location::file, file); }
  Status inPhase(const std::string &phase) const { return locate(&Location::phase, phase); }
  Status atOp(const std::string &op) const { return locate(&Location::op, op); }
  Status forParameter(const std::string &name) const { return locate(&Location::parameter, name); }
  /// The same error, said to be of `kind` (an error is ok() no more or less).
  Status as(ErrorKind kind) const {
    if (isOk())
      return *this;
    Status s = *this;
    s.kind_ = kind;
    return s;
  }
  /// The process exit code for this status: 0, 2 for bad input, 1 otherwise.
  int exitCode() const { return isOk() ? 0 : kind_ == ErrorKind::BadInput ? 2 : 1; }

private:
  Status() = default;
  Status(std::string message, ErrorKind kind) : message_(std::move(message)), kind_(kind) {}
  Status locate(std::string Location::*part, const std::string &value) const {
    if (isOk() || !(location_.*part).empty())
      return *this;
    Status s = *this;
    s.location_.*part = value;
    return s;
  }
  std::optional<std::string> message_;
  std::string context_;
  Location location_;
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
