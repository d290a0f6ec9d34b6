// SPDX-License-Identifier: Apache-2.0
// Status and Result<T>: how errors travel beneath the public API.
//
// Note [Errors]
// The public API throws tutti::Error; everything beneath it returns Status or Result<T>. A
// Status becomes an exception in two places only: the public entry points (argument errors,
// before anything is queued) and Handle::wait() (whatever the communication thread found).
// Nothing throws out of a thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "tutti/error.h"

namespace tutti {

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK.
  Status(ErrorCode code, const std::string& message)
      : error_(std::make_shared<const Error>(code, message)) {}

  bool ok() const { return error_ == nullptr; }
  ErrorCode code() const { return error_ ? error_->code() : ErrorCode::Internal; }
  std::string_view message() const { return error_ ? error_->what() : ""; }

  // The API boundary: throws the tutti::Error unless ok(). A new Error with its own copy of
  // the message, not a copy of the shared one: std::runtime_error's copies share a
  // reference-counted string, and the other holders of this Status live on other threads.
  void throw_if_error() const {
    if (error_) throw Error(error_->code(), error_->what());
  }

 private:
  // Null when OK. Immutable and shared: failing a thousand handles with one Status copies a
  // pointer, not a message.
  std::shared_ptr<const Error> error_;
};

inline Status invalid_argument(const std::string& message) {
  return Status(ErrorCode::InvalidArgument, message);
}

// A T, or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  // Implicit, so that functions can `return value;` and `return status;`.
  Result(T value) : state_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : state_(std::move(status)) {}  // NOLINT  Requires !status.ok().

  bool ok() const { return std::holds_alternative<T>(state_); }
  Status status() const { return ok() ? Status() : std::get<Status>(state_); }
  T& value() & { return std::get<T>(state_); }  // Requires ok().
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }

  // The API boundary: the value, or the tutti::Error thrown.
  T value_or_throw() && {
    status().throw_if_error();
    return std::get<T>(std::move(state_));
  }

 private:
  std::variant<Status, T> state_;
};

#define TUTTI_RETURN_IF_ERROR(expr)                                               \
  do {                                                                            \
    if (::tutti::Status tutti_status_ = (expr); !tutti_status_.ok()) [[unlikely]] \
      return tutti_status_;                                                       \
  } while (false)

#define TUTTI_CONCAT_INNER_(a, b) a##b
#define TUTTI_CONCAT_(a, b) TUTTI_CONCAT_INNER_(a, b)
#define TUTTI_ASSIGN_OR_RETURN_IMPL_(result, lhs, expr) \
  auto result = (expr);                                 \
  if (!result.ok()) [[unlikely]]                        \
    return result.status();                             \
  lhs = std::move(result).value()
// TUTTI_ASSIGN_OR_RETURN(auto comm, MpiComm::duplicate(parent));
#define TUTTI_ASSIGN_OR_RETURN(lhs, expr) \
  TUTTI_ASSIGN_OR_RETURN_IMPL_(TUTTI_CONCAT_(tutti_result_, __LINE__), lhs, expr)

}  // namespace tutti
