// SPDX-License-Identifier: Apache-2.0
// The stall inspector: names the ranks and ops that hold everyone up (a warning after
// TUTTI_STALL_CHECK_TIME_SECONDS), and past TUTTI_STALL_SHUTDOWN_TIME_SECONDS says that every
// rank must stop with Stalled. Runs on the coordinator, over its pending ops.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "src/common/status.h"
#include "src/core/config.h"
#include "src/core/negotiation/coordinator.h"

namespace tutti::core {

// Communication thread of the coordinator only.
class StallInspector {
 public:
  explicit StallInspector(const Config& config);

  // Looks at the pending ops every tenth of the smaller limit (10 ms to 1 s apart):
  // logs one warning per newly stalled op, and returns the Stalled status every rank must stop
  // with once one has waited past the shutdown limit (the same explanation on every rank),
  // also where that limit is below the check time.
  std::optional<Status> inspect(const Coordinator& coordinator, Clock::time_point now);

 private:
  // "rank R: a, b; rank S: c": up to a few of `stalls` per rank missing from them.
  static std::string missing_list(const std::vector<Coordinator::Stall>& stalls);

  const bool disabled_;
  const Clock::duration check_after_;
  const Clock::duration shutdown_after_;  // Zero: never.
  const Clock::duration look_after_;      // The smaller limit: ops younger are not stalled.
  const Clock::duration interval_;        // Between looks: see kCheckInterval.
  Clock::time_point last_check_;
  std::map<std::string, bool> warned_;  // "<set>:<name>" of ops already warned about.
};

}  // namespace tutti::core
