// SPDX-License-Identifier: Apache-2.0
// Log lines to stderr: "[tutti rank R] LEVEL time: message". Level from TUTTI_LOG_LEVEL.
#pragma once

#include <string>
#include <string_view>

#include "src/base/strings.h"

namespace tutti::detail {

enum class LogLevel { Trace, Debug, Info, Warning, Error, Fatal };

// Parses "TRACE".."FATAL" (any case); false if unknown.
bool parse_log_level(std::string_view text, LogLevel* level);

// Process-wide logging settings. Any thread. The rank is -1 until a session knows it.
void set_log_level(LogLevel level);
void set_log_hide_time(bool hide);
void set_log_rank(int rank);
bool log_enabled(LogLevel level);

// Writes one whole line with a single write(2), so lines of different threads and ranks do not
// interleave. Any thread.
void log_message(LogLevel level, const std::string& message);

}  // namespace tutti::detail

#define TUTTI_LOG_(level, ...)                                                    \
  do {                                                                            \
    if (::tutti::detail::log_enabled(level))                                      \
      ::tutti::detail::log_message(level, ::tutti::detail::str_cat(__VA_ARGS__)); \
  } while (false)
#define TUTTI_LOG_DEBUG(...) TUTTI_LOG_(::tutti::detail::LogLevel::Debug, __VA_ARGS__)
#define TUTTI_LOG_INFO(...) TUTTI_LOG_(::tutti::detail::LogLevel::Info, __VA_ARGS__)
#define TUTTI_LOG_WARNING(...) TUTTI_LOG_(::tutti::detail::LogLevel::Warning, __VA_ARGS__)
#define TUTTI_LOG_ERROR(...) TUTTI_LOG_(::tutti::detail::LogLevel::Error, __VA_ARGS__)
