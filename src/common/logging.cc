// SPDX-License-Identifier: Apache-2.0
#include "src/common/logging.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <ctime>

namespace tutti::detail {
namespace {

std::atomic<LogLevel> g_level{LogLevel::Warning};
std::atomic<bool> g_hide_time{false};
std::atomic<int> g_rank{-1};

constexpr std::string_view kLevelNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};

}  // namespace

bool parse_log_level(std::string_view text, LogLevel* level) {
  std::string upper(text);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (std::size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (upper == kLevelNames[i]) {
      *level = static_cast<LogLevel>(i);
      return true;
    }
  }
  return false;
}

void set_log_level(LogLevel level) { g_level.store(level); }
void set_log_hide_time(bool hide) { g_hide_time.store(hide); }
void set_log_rank(int rank) { g_rank.store(rank); }
bool log_enabled(LogLevel level) { return level >= g_level.load(std::memory_order_relaxed); }

void log_message(LogLevel level, const std::string& message) {
  std::string line = "[tutti";
  if (const int rank = g_rank.load(); rank >= 0) line += str_cat(" rank ", rank);
  line += "] ";
  line += kLevelNames[static_cast<int>(level)];
  if (!g_hide_time.load()) {
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    std::tm local{};
    localtime_r(&seconds, &local);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, " %H:%M:%S", &local);
    line += stamp;
  }
  line += ": ";
  line += message;
  line += '\n';
  // One write: lines stay whole when threads and ranks share a terminal.
  std::size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = ::write(2, line.data() + written, line.size() - written);
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
}

}  // namespace tutti::detail
