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
// still pending with the reason it ended (ShutDown when a peer shut down), after settling what
// already arrived (Note [Settling at the end]).
//
// Note [Settling at the end]
// Any rank's shutdown() ends every rank's session, through the coordinator's bye on the
// control plane, which is not the channel's communicator: MPI orders neither's messages
// against the other's. So a receive whose message the peer sent before it shut down may still
// be unmatched, or its payload transfer done in MPI but not yet collected, when the bye ends
// the loop: the loop's cycle takes the control plane's messages after its point-to-point step,
// and may take several in a row. Failing such a receive with "rank 1 shut down" lost a message
// its sender had finished sending (a CI run of the README's ring snippet on 2 ranks: most
// likely rank 1's 4 KB payload landed during the control plane's polls, and its shutdown
// request came in the same receive() pass); a send that MPI had finished but the engine not
// yet collected failed the same way. So finish() first settles: it matches waiting receives
// (the queued ones included) and collects finished transfers until none is left, or until a
// pass finds nothing new once kSettleTime has passed; only then does it fail the rest. A send
// that finishes now may have been discarded by its receiver's own end (Note [Sends finished
// before their buffers are released] in ops/mpi/mpi_p2p.cc): it completes all the same, as
// tutti/p2p.h and MPI say (a send completes when its buffer may be reused, not when it is
// received; an eager send completes at once either way). Queued sends are not started. Not
// after a communication error or an engine failure, where MPI may no longer answer. The wait
// is paid only where ops are pending at the end, which is then an error for them, and is short
// beside a job's shutdown.
// What settling cannot save is a receive posted after the end: it is refused with ShutDown,
// which is why the README's snippet meets at a barrier before shutdown(). That snippet without
// the barrier, 150 runs on 2 ranks beside two busy loops (2-core AMD EPYC VM): before, 59 failed
// with "rank 1 shut down" (24 in wait_all, 35 in recv); after, none did, and 23 failed with the
// late receive refused; with the barrier, none of 150 failed.
//
// Note [A waiting thread drives point-to-point]
// A ping-pong through the communication thread handed each message over four times between a
// rank's threads (submit, start, arrive, complete), each a wake-up and a context switch of
// some 2.5 us where the two threads share a CPU: 7-10 us one way against plain MPI's 0.2 (P6,
// 2-core AMD EPYC VM). So the engine is not the communication thread's alone: whichever thread
// holds its lock runs its step, and
//  - the submitting thread runs one step right after its push: a small send is started, and
//    usually done, before the call returns, and the loop is woken only for what is left in
//    flight and moves only while polled (Note [Waking the loop for point-to-point]);
//  - a thread in wait() on a point-to-point op runs steps itself, without pause, for up to
//    200 us (OpState::wait()), then hands the op back to the loop and sleeps as for any op.
// The communication thread only tries the lock: while an application thread drives, its loop
// skips the stage. An error a driving thread meets (a stall, a failed MPI call) is kept for the
// loop, which stops on it as on its own. Driving needs MPI_THREAD_MULTIPLE (the application
// thread calls MPI beside the loop) and a host with no more ranks than CPUs (the spin would
// keep a CPU a peer needs); otherwise the loop alone runs the stage, as before.
//
// Note [Waking the loop for point-to-point]
// A driving thread's step wakes the communication thread only for the ops it started that move
// only while this rank polls MPI: a send not yet complete (MPI may still hold its header or its
// data), and a receive of more than kInlineBytes (its data follows its header, and the sender's
// MPI pipelines it only while both ends poll). A receive of up to kInlineBytes that is still
// waiting for its message needs nobody: the message arrives whole, inside its header, with no
// help from this rank, and the thread that waits on or polls the receive takes it. (A larger
// message than the receive expects is a Mismatch; it is consumed when the receive is next
// polled.) Waking the loop for it cost P6's ping-pong a wake-up of the communication thread per
// message: 0.85 context switches a round trip over both ranks on the 2-core AMD EPYC VM, 0.02
// without; one-way 1.34-1.37 us against 1.30-1.33. Where such a wake-up is dear it was worse:
// once idle past kP2PSpinTime the loop sleeps again after each look, so every message paid two
// context switches and a timer (examples/BENCHMARK_LOG.md, sixteenth round). The loop still finds
// such a receive on its own: it naps for at most kQuietCap (Note [Quiet naps] in idle_policy.h),
// then polls while ops are in flight, so a receive nobody waits on is still watched for stalls
// and completed.
// For a blocking send() or recv() the loop is not woken even then: its thread waits on the op after
// submitting it and drives the engine while it waits (for up to 200 us, then it hands the op
// back, which wakes the loop), so the loop's wake-up would only take turns with it where the
// two share a CPU. Its submitting step wakes the loop only for the other ops it started (other
// threads' ops it took from the queue) that need polling. A ping-pong with blocking send() and
// recv() (p2p_benchmark --sweep-sizes) on the 2-core AMD EPYC VM (family 26; two ranks, each
// bound to one core it shares with its communication thread), medians of one-way time in three
// alternated pairs of runs: 4 KB 10.5-13.8 us before, 6.1-7.6 after (raw MPI 4.4-5.3); 64 KB
// 21.3-24.8 before, 12.3-15.1 after (raw 10.8-12.5); 16 MB at 1.06-1.16x raw either way
// (examples/BENCHMARK_LOG.md, fifty-seventh round). (Owing the wake instead, paid after the wait
// if anything still needed polling, woke the loop after each send of P6's pattern for the
// irecv() posted before it, which the loop already watched: 64 KB in that pattern took 28.5-32.6
// us against 20.3-26.5 before.) Nor is the loop woken where it looks soon anyway (next Note).
//
// Note [A wake left to the loop's next look]
// In P6's own pattern (irecv(), then send(), then a wait on the receive) the receive's submission
// woke the loop for a message above kInlineBytes, which moves only while this rank polls if nobody
// waits on it. But its thread was about to wait on it: the loop, woken on the core the thread spins
// on, took turns with it, and 4-64 KB took 1.5-3.8x raw MPI (fifty-seventh round of
// examples/BENCHMARK_LOG.md). A probe that never woke the loop took 1.46x at 4 KB and 1.17x at
// 64 KB, and left an op nobody waits on to the loop's next look, up to 100 ms away. What the op
// needs is a look soon, not a wake-up now. So the loop says, each time it pauses, when it runs its
// next cycle at the latest (before_pause(): the end of its nap, or now when it only yields), and a
// driving thread that started such ops wakes it only if that is more than kLookWithin away (an idle
// job's nap, up to 100 ms). A loop with ops in flight naps at most kBusyCap (idle_policy.h), which
// kLookWithin covers, so a stream of such ops does not wake it, and an op nobody waits on still has
// the loop look within 200 us, then poll it as any op in flight. The race: the loop decides a long
// nap while no op is in flight, and a driving thread starts one before the loop lies down. Each
// side stores, then reads the other's word in sequential consistency (the loop its announcement,
// then left_to_loop_; the thread left_to_loop_, then next_look_), so at least one of them sees the
// other: the thread the long nap (it wakes the loop), or the loop the op left to it (it naps
// kLookWithin at most). The flag is set only for ops that need polling, and cleared by the loop's
// own step, which then sees them in flight: a first version read busy_ instead, and cut the loop's
// naps for any op, small receives included, which raised the CPU of P6's 1-float ping-pong from
// 3.0-3.3 us a round trip to 3.4-3.7 (most likely as its loop woke every 200 us instead of every
// 10 ms; not counted). While an application thread runs the loop's cycles (Note [A waiting thread
// runs the cycle] in loop_driver.h) nothing is announced: those cycles poll point-to-point too, and
// a wake does not end that sleep anyway (it lasts up to 1 ms, kDrivenWatch in background_loop.cc).
// p2p_benchmark --sweep-sizes, P6's pattern, the 2-core AMD EPYC VM (family 26; two ranks, each
// bound to a core it shares with its communication thread), six alternated pairs, against raw MPI:
// 4 KB 1.51-3.47x before, 1.44-1.53x after; 64 KB 1.30-2.75x before, 1.18-1.26x after; blocking
// send/recv, 1-16 MB and P6 alike either way (examples/BENCHMARK_LOG.md, fifty-ninth round).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/p2p_channel.h"
#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/core/completer.h"
#include "src/core/config.h"
#include "src/core/op_state.h"
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

// Application threads push; the engine's step drains (on whichever thread runs it);
// Session::finish() closes.
class P2PQueue {
 public:
  // Any thread. All or none of `ops`; ShutDown after close().
  Status push(std::vector<P2POpEntry> ops) TUTTI_EXCLUDES(mutex_);
  std::vector<P2POpEntry> drain() TUTTI_EXCLUDES(mutex_);
  bool empty() TUTTI_EXCLUDES(mutex_);
  // Refuses later pushes with `status`; returns what was never drained.
  std::vector<P2POpEntry> close(const Status& status) TUTTI_EXCLUDES(mutex_);
  // Takes the undrained ops on process set `set_id` out of the queue.
  std::vector<P2POpEntry> take_set(int set_id) TUTTI_EXCLUDES(mutex_);

 private:
  detail::Mutex mutex_;
  Status closed_ TUTTI_GUARDED_BY(mutex_);
  std::vector<P2POpEntry> new_ TUTTI_GUARDED_BY(mutex_);
};

// A message's header (Note [P2P protocol]): `dtype`, whether the payload is inline, `count`
// elements, then the `inline_bytes` at `inline_data` (null: the payload follows as a message of
// its own).
std::string encode_p2p_header(DataType dtype, std::int64_t count, const void* inline_data,
                              std::size_t inline_bytes);

// Steps run under a lock, by the communication thread or by an application thread (Note [A
// waiting thread drives point-to-point]).
class P2PEngine final : public detail::Driver {
 public:
  // Payloads up to this size ride inside the header: one MPI message per op.
  static constexpr std::size_t kInlineBytes = 2048;
  static constexpr int kMaxUserTag = 32767;
  // Sets with larger ids have no channel tags (see channel_tag()).
  static constexpr int kMaxSetId = 127;

  // `channel` may be null (a transport without one): then every op fails with Internal.
  // `drivable`: application threads may run steps (MPI_THREAD_MULTIPLE, and no more ranks on
  // the host than CPUs). `wake_loop` wakes the communication thread; any thread.
  P2PEngine(std::unique_ptr<ops::P2PChannel> channel, P2PQueue& queue, const Completer& completer,
            const Config& config, bool drivable, std::function<void()> wake_loop);

  // The channel tag of (set, tag), or -1 if the set id is too large for the channel.
  static int channel_tag(int set_id, int tag);
  // InvalidArgument for an op whose channel tag lies beyond the channel's tag space (an MPI
  // whose MPI_TAG_UB is below what channel_tag() uses). Any thread.
  Status check_tag(const P2POpEntry& op) const;

  // Communication thread. One step, unless an application thread is running one: new ops,
  // arrived headers, completed transfers, stalls. Sets *did_work when anything moved. Returns
  // Stalled when an op waited past the shutdown limit (the loop then stops, and finish() fails
  // that op with it), or a communication error, a driving thread's included; once one is
  // returned, every later call returns it without a step.
  Status progress(Clock::time_point now, bool* did_work) TUTTI_EXCLUDES(mutex_);
  // Whether ops are in flight (the loop keeps polling then). Any thread.
  bool busy() const { return busy_.load(std::memory_order_acquire); }
  // Whether application threads may drive the engine.
  bool drivable() const { return drivable_; }
  // Application threads (detail::Driver): one step if the lock is free. The communication
  // thread is woken when the step started ops that are still in flight and move only while
  // polled (Note [Waking the loop for point-to-point]), and for an error, which its progress()
  // then returns. Nothing after an error or finish().
  void drive() override TUTTI_EXCLUDES(mutex_);
  // Application threads: drive()'s step for a thread that submitted op `own` and waits on it at
  // once: `own` does not count toward the wake (Note [Waking the loop for point-to-point]).
  void drive_before_wait(const Entry& own) TUTTI_EXCLUDES(mutex_);
  // Wakes the communication thread, which polls for the op a thread stopped driving.
  void hand_back() override TUTTI_EXCLUDES(mutex_);
  // Communication thread, about to pause for `nap` (0: it runs its next cycle at once): says
  // when it looks next, and returns the nap to take: `nap`, or kLookWithin if that is shorter
  // and a driving thread has, since the loop's last step, started ops that need polling,
  // counting on a look within kLookWithin (Note [A wake left to the loop's next look]).
  std::chrono::microseconds before_pause(Clock::time_point now, std::chrono::microseconds nap);
  // A driving thread that starts ops needing polling does not wake the loop if the loop looks
  // within this anyway (Note [A wake left to the loop's next look]).
  static constexpr std::chrono::microseconds kLookWithin{200};
  // Communication thread, as process set `set_id` is removed: fails its queued ops and its
  // receives that no message has reached yet with `status`. Transfers under way finish.
  void fail_set(int set_id, const Status& status) TUTTI_EXCLUDES(mutex_);
  // The session ends: completes the receives whose messages already arrived and the transfers
  // MPI finished (Note [Settling at the end]; not when `status` is a Communication error), then
  // fails every other op in flight or queued with `status`, abandons transfers, and releases the
  // channel; ops submitted later get `refused` (ShutDown). Later drive() and hand_back() calls
  // do nothing, so an engine that a driving thread keeps past its session touches nothing of
  // the session.
  void finish(const Status& status,
              const Status& refused = Status(ErrorCode::ShutDown, "Tutti has shut down"))
      TUTTI_EXCLUDES(mutex_);

 private:
  struct Active {
    P2POpEntry op;
    Status status;              // The receive's end (Mismatch if consumed into scratch).
    std::vector<char> scratch;  // A mismatched payload lands here.
  };
  // drive() and drive_before_wait(): one step if the lock is free, then the wake if ops it
  // started, besides `own` (if not null), need polling.
  void step_on_app_thread(const Entry* own) TUTTI_EXCLUDES(mutex_);
  // Whether ops in flight, besides `own` (if not null), move only while this rank polls (Note
  // [Waking the loop for point-to-point]).
  bool needs_polling(const Entry* own = nullptr) const TUTTI_REQUIRES(mutex_);
  // How long finish() waits for messages already in flight (Note [Settling at the end]).
  static constexpr std::chrono::milliseconds kSettleTime{50};
  // finish()'s matching of what already arrived (Note [Settling at the end]).
  void settle() TUTTI_REQUIRES(mutex_);
  // One step (progress()'s): advance(), then busy_ updated.
  Status step(Clock::time_point now, bool* did_work) TUTTI_REQUIRES(mutex_);
  Status advance(Clock::time_point now, bool* did_work) TUTTI_REQUIRES(mutex_);
  // Header matching for the receives in waiting_, oldest first.
  Status match_waiting(bool* did_work) TUTTI_REQUIRES(mutex_);
  // Completes the transfers the channel finished.
  Status complete_finished(bool* did_work) TUTTI_REQUIRES(mutex_);
  Status start(P2POpEntry op) TUTTI_REQUIRES(mutex_);
  // Gives waiting receive `op` the header it was matched with: completes it (a payload inside
  // the header, or a mismatch, which fails `op` alone) or starts receiving its payload. Returns
  // an error, which fails the session, for a malformed header or a receive that did not start.
  Status accept(P2POpEntry& op, ops::P2PChannel::Header header) TUTTI_REQUIRES(mutex_);
  void complete(P2POpEntry& op, const Status& status) TUTTI_REQUIRES(mutex_);
  Status check_stalls(Clock::time_point now) TUTTI_REQUIRES(mutex_);
  // Stalled if `op` waited past the shutdown limit; warns once past the check time.
  Status inspect(P2POpEntry& op, Clock::time_point now) TUTTI_REQUIRES(mutex_);
  static std::string describe(const P2POpEntry& op);

  detail::Mutex mutex_;
  std::unique_ptr<ops::P2PChannel> channel_ TUTTI_GUARDED_BY(mutex_);
  P2PQueue& queue_;
  const Completer& completer_;
  const Config& config_;
  const bool drivable_;
  const int max_channel_tag_;  // The channel's max_tag() (no limit without a channel).
  const std::function<void()> wake_loop_;
  std::deque<P2POpEntry> waiting_ TUTTI_GUARDED_BY(mutex_);  // Receives before their header.
  std::map<ops::P2PChannel::Id, Active> active_ TUTTI_GUARDED_BY(mutex_);  // In progress.
  std::map<const Entry*, bool> warned_ TUTTI_GUARDED_BY(mutex_);           // Reported as stalled.
  Clock::time_point last_stall_check_ TUTTI_GUARDED_BY(mutex_){};
  // The first error a step met, on any thread: progress() returns it, and no step runs after.
  Status failed_ TUTTI_GUARDED_BY(mutex_);
  bool finished_ TUTTI_GUARDED_BY(mutex_) = false;
  bool started_ TUTTI_GUARDED_BY(mutex_) = false;  // The last step took ops from the queue.
  std::atomic<bool> busy_{false};  // waiting_ or active_ non-empty, as of the last step.
  // A driving thread started ops that need polling and did not wake the loop, counting on its
  // next look; cleared by the loop's own step. Stored and read in sequential consistency beside
  // next_look_ (Note [A wake left to the loop's next look]).
  std::atomic<bool> left_to_loop_{false};
  // When the communication thread runs its next cycle at the latest, as nanoseconds on Clock:
  // the end of its nap, or the start of its next cycle (before_pause()). Never, until its first
  // pause says: a driving thread wakes it until then.
  std::atomic<std::int64_t> next_look_{std::numeric_limits<std::int64_t>::max()};
  // Whether the communication thread's next look is due within kLookWithin of now.
  bool loop_looks_soon() const;
};

}  // namespace tutti::core
