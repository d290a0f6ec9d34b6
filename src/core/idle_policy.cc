// SPDX-License-Identifier: Apache-2.0
#include "src/core/idle_policy.h"

#include <algorithm>

namespace tutti::core {

Pause idle_pause(const IdleFacts& facts) {
  // A message partly received completes only while the plane is polled. Point-to-point ops in
  // flight: poll on for a while (ping-pong latency), and for as long as an application thread
  // waits: a large message moves only while both ends poll (MPI pipelines it in fragments when
  // it cannot copy it in one go), and its progress is invisible until it completes, so `idle`
  // grows during a healthy transfer, and napping then cut the bandwidth to a fragment per nap
  // (Note [The cycle] in background_loop.h).
  const bool poll = (facts.idle < kSpinTime && facts.app_waiting) || facts.receiving ||
                    (facts.p2p_busy && (facts.idle < kP2PSpinTime || facts.app_waiting));
  if (poll) return Pause{.yield = true};
  const bool in_flight = !facts.queue_empty || facts.p2p_busy;
  // See Note [Quiet naps] in idle_policy.h.
  const std::chrono::microseconds cap =
      in_flight ? kBusyCap : (facts.messages_may_wait ? kQuietCap : kIdleCap);
  return Pause{.nap = std::clamp(facts.idle / 8, kMinNap, cap)};
}

}  // namespace tutti::core
