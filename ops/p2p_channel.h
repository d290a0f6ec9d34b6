// SPDX-License-Identifier: Apache-2.0
// The channel point-to-point messages (tutti/p2p.h) travel on: a communicator of its own, so
// they never meet negotiation's or RPC's messages (issue 13).
//
// Note [P2P protocol]
// A message is a header, then (unless the payload rode inside the header) the payload, both
// under the same channel tag and in that order, so MPI's non-overtaking rule keeps the pairs
// together per (sender, tag). The receiver dequeues headers with a matched probe, one at a
// time on the communication thread, and posts the payload receive at once, so payloads match
// in header order even with any-source receives. Payloads go in chunks of at most 2^30 bytes,
// so any size that fits in memory works.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/common/status.h"

namespace tutti::ops {

// One thread at a time: the one running the P2PEngine's step (the communication thread, or an
// application thread driving the engine under its lock).
class P2PChannel {
 public:
  using Id = std::uint64_t;
  struct Header {
    int source = 0;  // Rank of the job (the channel spans every rank).
    std::string bytes;
  };

  virtual ~P2PChannel() = default;
  // The largest channel tag: on MPI (MPI_TAG_UB - 1) / 2, which the standard lets be as low as
  // 16383 (2^30 - 1 on Open MPI, 2^27 - 1 on Debian's MPICH).
  virtual int max_tag() const = 0;
  // Starts sending `header`, then `bytes` bytes at `data` (which must stay valid until the
  // send completes), to rank `destination` under `tag`.
  virtual Result<Id> start_send(int destination, int tag, std::string header, const void* data,
                                std::size_t bytes) = 0;
  // Dequeues the next header from `source` (-1: any rank) under `tag`, if one has arrived.
  virtual Result<std::optional<Header>> take_header(int source, int tag) = 0;
  // Starts receiving the `bytes`-byte payload that followed a header taken from `source`.
  virtual Result<Id> start_receive(int source, int tag, void* data, std::size_t bytes) = 0;
  // Transfers started above that have completed since the last call. Never blocks.
  virtual Result<std::vector<Id>> completed() = 0;
  // Whether the transfer is still in progress.
  virtual bool active(Id id) const = 0;
  // Abandons every transfer in progress (cancelling what MPI can cancel): the session ends.
  virtual void abandon() = 0;
};

}  // namespace tutti::ops
