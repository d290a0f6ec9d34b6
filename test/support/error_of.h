// SPDX-License-Identifier: Apache-2.0
// The error a call throws, for tests that expect one.
#pragma once

#include <optional>
#include <string>

#include "tutti/error.h"

namespace tutti::test {

// The code of the tutti::Error `f` throws (its message into *message), or nullopt if it
// throws none.
template <class F>
std::optional<ErrorCode> error_of(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return std::nullopt;
}

}  // namespace tutti::test
