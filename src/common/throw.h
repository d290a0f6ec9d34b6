// SPDX-License-Identifier: Apache-2.0
// Throwing a tutti::Error with a message built from pieces, for code that reports errors by
// exception (the public entry points and the training layers). Header-only.
#pragma once

#include "src/base/strings.h"
#include "tutti/error.h"

namespace tutti::detail {

// Throws Error(InvalidArgument) whose message is the arguments printed one after another.
template <class... Args>
[[noreturn]] void throw_invalid_argument(const Args&... args) {
  throw Error(ErrorCode::InvalidArgument, str_cat(args...));
}

}  // namespace tutti::detail
