// SPDX-License-Identifier: Apache-2.0
// TUTTI_CHECK: broken invariants (bugs) abort the whole job.
#pragma once

#include <string>

#include "src/base/strings.h"

namespace tutti::detail {

// Logs "file:line: check failed: condition: message" with the rank prefix, then aborts the
// whole job (MPI_Abort once MPI is up, else std::abort). Aborting is the only outcome that
// cannot hang: an exception or early return on one rank leaves its peers blocked in a
// collective.
[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);

}  // namespace tutti::detail

// The message is mandatory: TUTTI_CHECK(x > 0) does not build.
#define TUTTI_CHECK(condition, message, ...)                                                       \
  do {                                                                                             \
    if (!(condition)) [[unlikely]] {                                                               \
      ::tutti::detail::check_failed(__FILE__, __LINE__, #condition,                                \
                                    ::tutti::detail::str_cat(message __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                              \
  } while (false)
