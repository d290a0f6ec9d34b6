// SPDX-License-Identifier: Apache-2.0
// Stage 2 of the cycle, on the coordinator (global rank 0) only: files every rank's requests,
// inspects stalls, and produces the response lists every rank executes, the last of them the
// shutdown's "bye". See Note [The cycle] and Note [Shutdown handshake] in background_loop.h.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "src/common/status.h"
#include "src/core/config.h"
#include "src/core/negotiation/coordinator.h"
#include "src/core/negotiation/desync_check.h"
#include "src/core/negotiation/stall_inspector.h"
#include "src/core/process_set_table.h"
#include "src/core/request.h"
#include "src/core/timeline.h"

namespace tutti::core {

// Communication thread of rank 0 only.
class CoordinatorStage {
 public:
  // `sets` and `timeline` (null = none) must outlive the stage; `size` is the job's size.
  CoordinatorStage(const Config& config, const ProcessSetTable& sets, Timeline* timeline, int size);

  // Files one rank's message (this rank's own as well). Returns the cache ids that rank must
  // resend in full. A rank's last message is counted, and starts the shutdown; so does a
  // desync (TUTTI_DEBUG=DETAIL, Note [Desync check]), with Mismatch.
  std::vector<std::int32_t> receive(int global_rank, RequestList list, Clock::time_point now);
  // Starts the shutdown with this reason (shutdown() on this rank, a stall, a fault);
  // `after_error` unless it is a shutdown() call. Only the first reason counts.
  void begin_shutdown(const Status& why, bool after_error);
  // The next list for every rank to execute, if there is one: the ready responses, and once
  // the shutdown has begun, the bye (the ready responses with `shutdown` set, so every rank
  // ends after the same ones). Nothing after the bye.
  std::optional<ResponseList> take_list(Clock::time_point now);

  // Nothing to decide or watch until a rank sends something: no op pending, no shutdown begun
  // (Note [Quiet naps] in idle_policy.h).
  bool quiet() const { return !shutdown_ && coordinator_.empty(); }
  bool bye_sent() const { return bye_sent_; }
  // Whether every other rank's last message has arrived (the handshake's end).
  bool all_last_messages() const { return last_messages_ == size_ - 1; }
  int last_messages() const { return last_messages_; }

 private:
  Coordinator coordinator_;
  StallInspector stalls_;
  std::optional<DesyncCheck> desync_;  // TUTTI_DEBUG=DETAIL only.
  const int size_;
  std::optional<Status> shutdown_;  // Why the job stops, once it does.
  bool shutdown_after_error_ = false;
  bool bye_sent_ = false;
  int last_messages_ = 0;  // Last messages received from other ranks.
};

}  // namespace tutti::core
