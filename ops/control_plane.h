// SPDX-License-Identifier: Apache-2.0
// The small-message channel negotiation runs over: ranks send requests to the coordinator
// (rank 0), the coordinator sends responses back. Non-blocking both ways, so the communication
// thread can sleep when idle instead of sitting in a collective (DESIGN.md section 3).
#pragma once

#include <optional>
#include <string>

#include "src/common/status.h"

namespace tutti::ops {

struct Message {
  int source = 0;
  std::string bytes;
};

// Communication thread only. Messages from one sender to one receiver arrive in send order.
class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Queues `bytes` for `destination` (not this rank) and returns at once.
  virtual Status send(int destination, std::string bytes) = 0;
  // The next message addressed to this rank, if one has arrived whole. Never blocks.
  virtual Result<std::optional<Message>> poll() = 0;
  // True while a message has begun to arrive but is not whole: poll() returns it once it is,
  // so a caller should poll again soon rather than sleep. Never blocks.
  virtual bool receiving() const = 0;
  // True once every queued send has completed. Never blocks.
  virtual bool sends_done() = 0;

  // ---- Ending the coordinator's long naps (Note [Doorbell] in ops/mpi/doorbell.h). A plane
  // without a doorbell (a rank not on the coordinator's host, a host of one rank, a transport
  // that has none) does nothing here, and wait_for_ring() returns false at once.
  // Whether this rank is the coordinator and the ranks of its host ring it.
  virtual bool rung_here() const { return false; }
  // Whether this rank is the coordinator and every message it may be sent ends its long naps:
  // every other rank rings it, or there is none (Note [Quiet naps] in src/core/idle_policy.h).
  virtual bool all_senders_ring() const { return false; }
  // This rank naps now, long: senders on its host ring it until nap_ends(), which is due
  // whatever this returns. True if a message has arrived meanwhile: then poll, do not nap.
  virtual bool nap_begins() { return false; }
  virtual void nap_ends() {}
  // Blocks until a sender rings (true) or stop_ring_waits() is called (false). One thread,
  // any (the ring is shared memory, not the plane's MPI).
  virtual bool wait_for_ring() { return false; }
  // Any thread.
  virtual void stop_ring_waits() {}

  // ---- The coordinator's bell for ranks on other hosts (Note [Net bell] in
  // ops/mpi/net_bell.h). A plane without one does nothing here, and wait_for_net_ring()
  // returns false at once.
  // Whether this rank is the coordinator and ranks on other hosts ring it.
  virtual bool net_rung_here() const { return false; }
  // Blocks until a ring (true) or stop_net_ring_waits() (false). One thread, any.
  virtual bool wait_for_net_ring() { return false; }
  // Any thread. Logs (INFO) how many rings came and from which ranks.
  virtual void stop_net_ring_waits() {}
  // Whether a ring came since the last call: its message may reach the plane a little after
  // it, so the caller should look again soon. Communication thread.
  virtual bool take_net_ring() { return false; }
  // Whether this rank rings the coordinator's net bell (it is on another host).
  virtual bool rings_net_bell() const { return false; }
  // After a message to the coordinator that should end its nap: rings, unless the coordinator
  // was heard from lately (so it cannot be napping long). Communication thread.
  virtual void ring_net_bell() {}
};

}  // namespace tutti::ops
