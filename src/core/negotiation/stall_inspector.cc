// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/stall_inspector.h"

#include "src/base/strings.h"
#include "src/common/logging.h"
#include "src/core/response_cache.h"

namespace tutti::core {
namespace {

using detail::str_cat;

constexpr std::chrono::seconds kCheckInterval{1};
// Names listed per missing rank, so that a warning stays readable.
constexpr std::size_t kNamesPerRank = 5;

}  // namespace

StallInspector::StallInspector(const Config& config)
    : disabled_(config.stall_check_disabled),
      check_after_(config.stall_check_time),
      shutdown_after_(config.stall_shutdown_time),
      last_check_(Clock::now()) {}

std::optional<Status> StallInspector::inspect(const Coordinator& coordinator,
                                              Clock::time_point now) {
  if (disabled_ || now - last_check_ < kCheckInterval) return std::nullopt;
  last_check_ = now;
  const std::vector<Coordinator::Stall> stalls = coordinator.stalls(now, check_after_);
  if (stalls.empty()) return std::nullopt;
  // Up to a few names per missing rank, in one explanation used for the warning and the error.
  std::map<int, std::vector<std::string>> by_rank;
  bool past_limit = false;
  bool fresh = false;
  for (const Coordinator::Stall& stall : stalls) {
    for (int r : stall.missing) {
      // An op of another set is named with it: the same name may be waiting in the global set
      // on other ranks, and "missing: rank 0: p" would then read as false.
      if (by_rank[r].size() < kNamesPerRank) {
        by_rank[r].push_back(stall.process_set_id == 0 ? stall.name
                                                       : str_cat(stall.name, " (process set ",
                                                                 stall.process_set_id, ")"));
      }
    }
    past_limit = past_limit || (shutdown_after_.count() > 0 && stall.waited >= shutdown_after_);
    bool& warned = warned_[cache_key(stall.process_set_id, stall.name)];
    fresh = fresh || !warned;
    warned = true;
  }
  std::string missing;
  for (const auto& [r, names] : by_rank) {
    missing += str_cat(missing.empty() ? "" : "; ", "rank ", r, ": ", detail::join_list(names));
  }
  const std::string explanation =
      str_cat("ops were submitted by some ranks but not by others for more than ",
              std::chrono::duration_cast<std::chrono::seconds>(check_after_).count(),
              " s; missing: ", missing);
  if (past_limit) {
    return Status(ErrorCode::Stalled,
                  str_cat("Stalled: ", explanation, " (past TUTTI_STALL_SHUTDOWN_TIME_SECONDS=",
                          std::chrono::duration<double>(shutdown_after_).count(), ")"));
  }
  if (fresh) TUTTI_LOG_WARNING("Stall: ", explanation);
  return std::nullopt;
}

}  // namespace tutti::core
