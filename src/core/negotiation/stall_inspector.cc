// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/stall_inspector.h"

#include <algorithm>

#include "src/base/strings.h"
#include "src/common/logging.h"
#include "src/core/response_cache.h"

namespace tutti::core {
namespace {

using detail::str_cat;

// Looks are at least a tenth of the smaller limit apart, within these bounds: a limit is met
// within about a tenth of itself (a second at most), and no busy cycle pays for the scan.
constexpr std::chrono::seconds kCheckInterval{1};
constexpr std::chrono::milliseconds kMinCheckInterval{10};
// Names listed per missing rank, so that a warning stays readable.
constexpr std::size_t kNamesPerRank = 5;

// In seconds as given (0.5, not a truncated 0).
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

StallInspector::StallInspector(const Config& config)
    : disabled_(config.stall_check_disabled),
      check_after_(config.stall_check_time),
      shutdown_after_(config.stall_shutdown_time),
      look_after_(shutdown_after_.count() > 0 ? std::min(check_after_, shutdown_after_)
                                              : check_after_),
      interval_(std::clamp<Clock::duration>(look_after_ / 10, kMinCheckInterval, kCheckInterval)),
      last_check_(Clock::now()) {}

std::string StallInspector::missing_list(const std::vector<Coordinator::Stall>& stalls) {
  // Up to a few names per missing rank.
  std::map<int, std::vector<std::string>> by_rank;
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
  }
  std::string missing;
  for (const auto& [r, names] : by_rank) {
    missing += str_cat(missing.empty() ? "" : "; ", "rank ", r, ": ", detail::join_list(names));
  }
  return missing;
}

std::optional<Status> StallInspector::inspect(const Coordinator& coordinator,
                                              Clock::time_point now) {
  if (disabled_ || now - last_check_ < interval_) return std::nullopt;
  last_check_ = now;
  std::vector<Coordinator::Stall> stalls = coordinator.stalls(now, look_after_);
  if (stalls.empty()) return std::nullopt;
  const bool past_limit =
      shutdown_after_.count() > 0 &&
      std::any_of(stalls.begin(), stalls.end(),
                  [&](const Coordinator::Stall& s) { return s.waited >= shutdown_after_; });
  if (past_limit) {
    // Every pending op fails with this status, so every one still missing a rank is named,
    // however young: with the shutdown limit below the check time the ops old enough to be
    // listed were only those past the limit, and an op a late rank submitted a moment after the
    // stalled one went unnamed. The message does not repeat the error's name: code that prints
    // the name, then what() ("Stalled: " + ...) showed it twice.
    return Status(
        ErrorCode::Stalled,
        str_cat("ops were submitted by some ranks but not by others, the oldest for more than ",
                seconds(shutdown_after_), " s (TUTTI_STALL_SHUTDOWN_TIME_SECONDS); missing: ",
                missing_list(coordinator.stalls(now, Clock::duration::zero()))));
  }
  // Ops younger than the check time are looked at only for the shutdown limit below it.
  std::erase_if(stalls, [&](const Coordinator::Stall& s) { return s.waited < check_after_; });
  bool fresh = false;
  for (const Coordinator::Stall& stall : stalls) {
    bool& warned = warned_[cache_key(stall.process_set_id, stall.name)];
    fresh = fresh || !warned;
    warned = true;
  }
  if (fresh) {
    TUTTI_LOG_WARNING("Stall: ops were submitted by some ranks but not by others for more than ",
                      seconds(check_after_), " s; missing: ", missing_list(stalls));
  }
  return std::nullopt;
}

}  // namespace tutti::core
