// SPDX-License-Identifier: Apache-2.0
// Point-to-point ops (tutti/p2p.h): a stage of their own beside the negotiated ones.
//
// Note [P2P stage]
// Sends and receives skip the coordinator. Application threads check the arguments and push
// P2POps on the P2PQueue (waking the communication thread); each cycle the P2PEngine drains
// it, starts sends, takes arrived headers for waiting receives (oldest receive first, so a
// receive posted earlier gets the earlier message), checks dtype and count, starts payload
// receives, and completes finished transfers through the Completer. The wire format is in
// Note [P2P protocol] (ops/p2p_channel.h): header = {dtype, inline flag, element count}, then
// the payload inline (at most kInlineBytes) or as a message of its own.
// A mismatched message is still received in full (into scratch memory) so it cannot poison
// the next receive. Ops waiting too long are reported with the stall settings: a warning
// after stall_check_time, Stalled (stopping this rank, and through the shutdown handshake the
// job) after stall_shutdown_time. When the session ends, Session::finish() fails whatever is
// still pending with the reason it ended (ShutDown when a peer shut down).
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/p2p_channel.h"
#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/core/completer.h"
#include "src/core/config.h"
#include "src/core/tensor_queue.h"

namespace tutti::core {

using Clock = std::chrono::steady_clock;

// One send or receive. `entry` carries the tensor (inputs[0]), the handle's state, the
// submission time, and a readable name ("isend to 1 tag 3") for the timeline and messages.
struct P2POpEntry {
  bool send = true;
  int peer = -1;  // Global rank; -1: any source (receives only).
  int tag = 0;    // The user's tag.
  int set_id = 0;
  int channel_tag = 0;  // Unique per (set, tag); see P2PEngine::channel_tag().
  std::shared_ptr<Entry> entry;
};

// Application threads push; the communication thread drains; Session::finish() closes.
class P2PQueue {
 public:
  // Any thread. All or none of `ops`; ShutDown after close().
  Status push(std::vector<P2POpEntry> ops) TUTTI_EXCLUDES(mutex_);
  std::vector<P2POpEntry> drain() TUTTI_EXCLUDES(mutex_);
  // Refuses later pushes with `status`; returns what was never drained.
  std::vector<P2POpEntry> close(const Status& status) TUTTI_EXCLUDES(mutex_);

 private:
  detail::Mutex mutex_;
  Status closed_ TUTTI_GUARDED_BY(mutex_);
  std::vector<P2POpEntry> new_ TUTTI_GUARDED_BY(mutex_);
};

// Communication thread only.
class P2PEngine {
 public:
  // Payloads up to this size ride inside the header: one MPI message per op.
  static constexpr std::size_t kInlineBytes = 2048;
  static constexpr int kMaxUserTag = 32767;

  // `channel` may be null (a transport without one): then every op fails with Internal.
  P2PEngine(std::unique_ptr<ops::P2PChannel> channel, P2PQueue& queue, const Completer& completer,
            const Config& config);

  // The channel tag of (set, tag), or -1 if the set id is too large for the channel.
  static int channel_tag(int set_id, int tag);

  // One step: new ops, arrived headers, completed transfers, stalls. Sets *did_work when
  // anything moved. Returns Stalled when an op waited past the shutdown limit (the loop then
  // stops, and finish() fails that op with it), or a communication error.
  Status progress(Clock::time_point now, bool* did_work);
  // Whether ops are in flight (the loop keeps polling then).
  bool busy() const { return !waiting_.empty() || !active_.empty(); }
  // The session ends: fails every op in flight or queued with `status`, abandons transfers.
  void finish(const Status& status);

 private:
  struct Active {
    P2POpEntry op;
    Status status;              // The receive's end (Mismatch if consumed into scratch).
    std::vector<char> scratch;  // A mismatched payload lands here.
  };
  Status start(P2POpEntry op);
  // Tries to take the header of a waiting receive; true if it was taken.
  Result<bool> match(P2POpEntry& op);
  void complete(P2POpEntry& op, const Status& status);
  Status check_stalls(Clock::time_point now);
  static std::string describe(const P2POpEntry& op);

  std::unique_ptr<ops::P2PChannel> channel_;
  P2PQueue& queue_;
  const Completer& completer_;
  const Config& config_;
  std::deque<P2POpEntry> waiting_;                // Receives before their header came.
  std::map<ops::P2PChannel::Id, Active> active_;  // Transfers in progress.
  std::map<const Entry*, bool> warned_;           // Ops already reported as stalled.
  Clock::time_point last_stall_check_{};
};

}  // namespace tutti::core
