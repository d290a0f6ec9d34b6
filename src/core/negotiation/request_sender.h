// SPDX-License-Identifier: Apache-2.0
// Stage 1 of the cycle, on every rank: this rank's newly submitted ops, as messages to the
// coordinator. See Note [The cycle] in background_loop.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "src/core/request.h"
#include "src/core/response_cache.h"
#include "src/core/tensor_queue.h"

namespace tutti::core {

// Communication thread only.
class RequestSender {
 public:
  // `queue` and `cache` (the response executor's, read here) must outlive the sender.
  // `send_sequences`: each list carries its requests' sequence numbers, for the desync check
  // (TUTTI_DEBUG=DETAIL, Note [Desync check] in negotiation/desync_check.h).
  // `shares_cpu`: the submitting threads run on this thread's CPU (Note [Batching on a shared
  // CPU] in request_sender.cc).
  RequestSender(TensorQueue& queue, const RankCache& cache, std::chrono::microseconds cycle_time,
                bool send_sequences = false, bool shares_cpu = false)
      : queue_(queue),
        cache_(cache),
        cycle_time_(cycle_time),
        send_sequences_(send_sequences),
        shares_cpu_(shares_cpu) {}

  // The ops submitted since the last call, as one list (cache ids for the ops the cache
  // knows), or nothing if there are none or this rank's last message was sent. Batches while
  // ops keep arriving (each drain of the queue finds more), at most the cycle time: a training
  // step submits many at once, and a lone op goes out at once.
  // `batch_by_yielding`: whether it may yield to let submitters go on (Note [Batching on a
  // shared CPU] in request_sender.cc); false on a thread that drives the loop.
  std::optional<RequestList> take_new(bool batch_by_yielding = true);
  // The full requests of this rank's ops in flight that were sent as the cache hits `ids`,
  // which the coordinator no longer knows; nothing once the last message was sent.
  std::optional<RequestList> take_resend(std::span<const std::int32_t> ids);
  // This rank's last message (Note [Shutdown handshake]): it stops after shutdown() (`why`
  // OK) or because of the error `why`.
  RequestList take_last(const Status& why);
  bool last_sent() const { return last_sent_; }
  // Autotune's new cycle time, from the next batch on (Note [Autotune] in autotune.h).
  void set_cycle_time(std::chrono::microseconds cycle_time) { cycle_time_ = cycle_time; }

 private:
  TensorQueue& queue_;
  const RankCache& cache_;
  std::chrono::microseconds cycle_time_;
  const bool send_sequences_;
  const bool shares_cpu_;
  bool last_sent_ = false;
  // take_new()'s batch, the queue's entries (TensorQueue::drain_new()); empty between calls.
  std::vector<Entry*> entries_;
  // Note [Lookup by the next id] in request_sender.cc: the id the next op is expected to hit
  // (the last hit's, plus one), and whether the last op looked up hit the id it was expected to
  // (only then does the next lookup try the expected id first).
  std::int32_t next_id_ = 0;
  bool in_order_ = false;
};

}  // namespace tutti::core
