// SPDX-License-Identifier: Apache-2.0
// The RPC agent: requests and responses with ids over a control plane of its own, futures with
// deadlines, the callee's pool, self-calls, peers leaving, and the graceful shutdown handshake.
//
// Note [RPC threading]
// Threads of an agent:
//  - Application threads (and functions on the pool making nested calls) call call(): it
//    records distributed autograd sends, forks RRefs, encodes the frame, registers the pending
//    call with its deadline and queues the bytes. They wait on the call's FutureState.
//  - The RPC thread, one per agent, is the only user of the agent's ops::ControlPlane, so the
//    only thread making MPI calls on RPC's communicator (but for a caller running its pass
//    under the same lock: below). It posts queued frames (fragmenting
//    big ones), delivers frames to this worker itself without MPI, polls for arriving frames and
//    decodes them, runs the RRef bookkeeping in arrival order (Note [RRef protocol]), completes
//    futures from responses, fails calls past their deadline (Timeout; a thread waiting for
//    the call fails it itself at the deadline, so that a late RPC thread cannot delay a
//    Timeout: FutureState::set_deadline) or to peers that left (ShutDown), and drives the shutdown
//    handshake (Note [Graceful shutdown] in agent_shutdown.cc).
//  - The pool (ThreadPool, RpcOptions::num_worker_threads) runs the functions called here and
//    the heavier internal handlers (distributed backward, optimizer steps), then queues the
//    response.
// Why a thread of its own rather than Tutti's communication thread: RPC is not negotiated (no
// rank waits for another to agree), so it gains nothing from the collective cycle and would
// only add the cycle's latency; and the communication thread is free to be restructured
// without RPC in mind. The price is two threads calling MPI at once (the RPC thread on RPC's
// communicator, the communication thread on the others), which needs MPI_THREAD_MULTIPLE:
// init_rpc() refuses with InvalidArgument when MPI provides less (tutti::mpi_threads_supported()).
// RPC's communicator is duplicated by the MPI transport at tutti::init(), ordered with the other
// collectives; the session owns the plane and lends it to one agent at a time, which holds the
// session alive (tutti::shutdown() stops the agent first).
// MPI cannot wake a thread sleeping on a condition variable, so the RPC thread polls: after any
// traffic, and while any send is still in flight (MPI progresses a big message's rendezvous only
// inside the sender's MPI calls), it keeps polling (yielding) for kSpinWindow, then sleeps on a
// condition variable with
// waits growing to kMaxSleep, until the next deadline at most. Frames queued locally wake it at
// once; a frame arriving from a peer after a quiet spell waits up to kMaxSleep. Idle, the
// thread costs about one MPI_Iprobe per kMaxSleep.
// A thread waiting in rpc_sync() may run the RPC thread's pass itself meanwhile (Note [A
// waiting caller runs the pass] in agent_drive.cc), so the RPC thread's state is the pass's:
// whoever holds pass_mutex_.
// Locks are never held while running callbacks or user code: futures complete, and handles
// die, outside every lock of the agent but the pass's (a pass completes futures from
// responses; their callbacks must not block, as on the RPC thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ops/control_plane.h"
#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/common/thread_annotations.h"
#include "src/dist_autograd/dist_context.h"
#include "src/rpc/future.h"
#include "src/rpc/rref_context.h"
#include "src/rpc/thread_pool.h"
#include "src/rpc/wire.h"
#include "tutti/rpc.h"

namespace tutti::rpc::detail {

// Distributed autograd's contexts, which the agent keeps and every call records into.
using dist_autograd::detail::ContextContainer;
using dist_autograd::detail::ContextScope;
using dist_autograd::detail::current_context_id;
using dist_autograd::detail::DistContext;
using dist_autograd::detail::make_global_id;

inline constexpr std::chrono::microseconds kSpinWindow{2000};
inline constexpr std::chrono::microseconds kMinSleep{50};
inline constexpr std::chrono::microseconds kMaxSleep{1000};
// Frames bigger than this cross the plane in pieces (MPI counts are int). Below it a frame goes
// whole: its pieces would be copies, in buffers not kept for reuse (Note [Byte buffers kept for
// reuse] in src/common/byte_buffers.h). At 64 MiB, a 64 MiB tensor's frame went in two pieces.
inline constexpr std::size_t kDefaultMaxPieceBytes = std::size_t{1} << 30;

// `seconds` (finite, >= 0) as a duration, capped so that deadlines cannot overflow.
Clock::duration to_duration(double seconds);
// `d` in seconds, for messages.
inline double to_seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct AgentOptions {
  int rank = 0;
  std::vector<std::string> names;  // Every worker's name, by rank.
  RpcOptions options;
  std::uint32_t epoch = 0;  // See Frame::epoch.
  std::size_t max_piece_bytes = kDefaultMaxPieceBytes;
  // Whether a thread waiting in call_sync() runs the pass itself (Note [A waiting caller runs
  // the pass] in agent_drive.cc): MPI_THREAD_MULTIPLE, and ranks not outnumbering the CPUs.
  bool callers_drive = false;
  // The runtime's stall-shutdown time (TUTTI_STALL_SHUTDOWN_TIME_SECONDS; zero: none, or the
  // stall inspector is off): how long shutdown(true) waits without progress, if longer than
  // the RPC timeout (Note [Graceful shutdown] in agent_shutdown.cc).
  Clock::duration stall_shutdown{};
};

// A request being served.
struct Incoming {
  int source = -1;
  std::uint64_t id = 0;
  std::string function;
  std::string meta;
  std::int64_t context_id = -1;
  Message args;
};

// An internal ("tutti.*") function: returns the future of its response, which may complete
// later (the response is sent then). Throwing a tutti::Error fails the call with it.
using Handler = std::function<std::shared_ptr<FutureState>(Incoming& request)>;
enum class Place { RpcThread, Pool };  // Where a handler runs; see Note [RPC threading].

// One worker's RPC agent (see Note [RPC threading]). Any thread unless a method says otherwise;
// the members under "RPC thread only" belong to run() and its helpers.
class Agent : public std::enable_shared_from_this<Agent> {
 public:
  // Starts the RPC thread and the pool. `plane` must outlive the agent: `keep_alive` (the core
  // session that owns it) is held until shutdown. `functions` are the user's, by name.
  static std::shared_ptr<Agent> start(ops::ControlPlane& plane, AgentOptions options,
                                      std::map<std::string, Function> functions,
                                      std::shared_ptr<const void> keep_alive);
  ~Agent();  // Shuts down (not gracefully) if shutdown() was not called.
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return static_cast<int>(options_.names.size()); }
  const std::string& name() const { return options_.names[static_cast<std::size_t>(rank())]; }
  WorkerInfo info(int rank) const { return {options_.names[static_cast<std::size_t>(rank)], rank}; }
  // The rank of worker `name`, or InvalidArgument.
  Result<int> rank_of(std::string_view name) const;
  const RpcOptions& options() const { return options_.options; }
  Clock::duration default_timeout() const;

  // Any thread. Calls `function` on worker `to`; see Note [RPC threading]. The future completes
  // with the response, Timeout after `timeout`, or ShutDown. Inside distributed autograd context
  // `context_id` (-1: none) the call is recorded (Note [Distributed autograd] in
  // src/dist_autograd/dist_engine.h). `args` must hold no empty Variable or RRef. The
  // future's errors name the call `shown` ("" for `function`): the user's function, where
  // `function` is the protocol's carrier of it (remote()'s "tutti.rref.create").
  std::shared_ptr<FutureState> call(int to, std::string function, Message args,
                                    Clock::duration timeout, std::int64_t context_id,
                                    std::string meta = {}, std::string shown = {});
  // Any thread. call() and a wait for its future, which has completed on return. With
  // AgentOptions::callers_drive the waiting thread runs the RPC thread's pass meanwhile
  // (Note [A waiting caller runs the pass] in agent_drive.cc).
  std::shared_ptr<FutureState> call_sync(int to, std::string function, Message args,
                                         Clock::duration timeout, std::int64_t context_id);
  // Before start() returns only (the registration functions of the other files).
  void add_handler(const std::string& name, Place place, Handler handler);
  // Runs user function `function` on the pool with `request`'s arguments and context; the
  // future completes with its result, or its exception as an Error naming this worker.
  std::shared_ptr<FutureState> run_function(const std::shared_ptr<Incoming>& request,
                                            const std::string& function);

  // Passes run by waiting callers so far (Note [A waiting caller runs the pass]), for tests.
  std::uint64_t driven_passes() const { return driven_passes_.load(std::memory_order_relaxed); }

  RRefContext& rrefs() { return rrefs_; }
  ContextContainer& contexts() { return contexts_; }

  // Application thread. Idempotent. See Note [Graceful shutdown] in agent_shutdown.cc.
  void shutdown(bool graceful) TUTTI_EXCLUDES(shutdown_mutex_);
  bool stopped() const { return stopped_.load(); }

 private:
  struct Pending {
    std::shared_ptr<FutureState> future;
    int destination = -1;
    std::string function;  // As the future's errors name it (call()'s `shown`).
    Clock::time_point deadline;
    Clock::duration timeout;
  };
  struct Outgoing {
    int destination = -1;
    std::string bytes;
    bool counted = true;  // A request or response (Note [Graceful shutdown]).
  };

  Agent(ops::ControlPlane& plane, AgentOptions options, std::map<std::string, Function> functions,
        std::shared_ptr<const void> keep_alive);

  // call()'s body; `notify`: wake the RPC thread for the frame (not when the caller drives).
  std::shared_ptr<FutureState> submit_call(int to, std::string function, Message args,
                                           Clock::duration timeout, std::int64_t context_id,
                                           std::string meta, std::string shown, bool notify);

  // Serialization (serialize.cc).
  WirePayload to_wire(const Message& message, int destination);
  Message from_wire(WirePayload payload, int source, const std::shared_ptr<DistContext>& context,
                    std::int64_t autograd_message_id);

  void enqueue(int destination, std::string bytes, bool counted, bool notify = true)
      TUTTI_EXCLUDES(queue_mutex_);
  void wake() TUTTI_EXCLUDES(queue_mutex_);  // Wakes the RPC thread from its sleep.
  void respond(const Incoming& request, const Result<Message>& result);
  void send_control(int destination, ControlKind kind, std::uint64_t round = 0,
                    std::uint64_t sent = 0, std::uint64_t received = 0);

  // The RPC thread (agent.cc).
  void run();
  // The pass's traffic: queued frames out, local frames and arrived ones processed. True if it
  // did any work. The RPC thread, or a driving caller (agent_drive.cc), under pass_mutex_.
  bool exchange(Status* fatal) TUTTI_REQUIRES(pass_mutex_);
  bool flush_outgoing(Status* fatal);
  bool poll_incoming(Status* fatal);
  void process(int source, std::string bytes);
  void handle_request(int source, Frame frame);
  void handle_response(int source, Frame frame);
  void handle_control(int source, const Frame& frame);
  void dispatch(std::shared_ptr<Incoming> request);
  void run_handler(const std::shared_ptr<Incoming>& request, const Handler& handler);
  Clock::time_point expire_calls();  // Returns the next deadline.
  // The Timeout of call `function` to `destination` past `timeout`.
  Status timed_out(const std::string& function, int destination, Clock::duration timeout) const;
  void peer_left(int rank, const Status& why);
  bool shutdown_step();  // True: leave the loop.
  bool locally_idle();
  // shutdown(true)'s wait (Note [Graceful shutdown]): how long without progress before it gives
  // up, and the names of the workers whose Intent has not arrived here.
  Clock::duration shutdown_patience() const;
  std::string missing_intents() TUTTI_EXCLUDES(intents_mutex_);
  void teardown(const Status& why) TUTTI_EXCLUDES(pending_mutex_, queue_mutex_, state_mutex_);

  // Driving (agent_drive.cc). One pass by a waiting caller if it gets pass_mutex_ at once
  // (else it yields); false once it must stop driving: the loop has ended or a pass failed.
  bool drive_once() TUTTI_EXCLUDES(pass_mutex_);
  // The RPC thread: sleeps while a caller drives, until woken or kMaxSleep has passed.
  void sleep_while_driven() TUTTI_EXCLUDES(queue_mutex_);

  ops::ControlPlane& plane_;
  const AgentOptions options_;
  std::shared_ptr<const void> keep_alive_;
  const std::map<std::string, Function> functions_;
  std::map<std::string, std::pair<Place, Handler>> handlers_;  // Fixed once started.
  RRefContext rrefs_;
  ContextContainer contexts_;
  std::unique_ptr<ThreadPool> pool_;
  std::thread thread_;

  std::atomic<std::uint64_t> next_id_{1};
  tutti::detail::Mutex pending_mutex_;
  std::map<std::uint64_t, Pending> pending_ TUTTI_GUARDED_BY(pending_mutex_);
  std::set<std::pair<Clock::time_point, std::uint64_t>> deadlines_ TUTTI_GUARDED_BY(pending_mutex_);
  std::vector<char> gone_ TUTTI_GUARDED_BY(pending_mutex_);  // Peers that left.
  // No more calls. Set under both mutexes; atomic, so that it may be read under either (or
  // none), which TUTTI_GUARDED_BY cannot say.
  std::atomic<bool> stopped_{false};

  tutti::detail::Mutex queue_mutex_;
  tutti::detail::CondVar queue_cv_;
  std::deque<Outgoing> outgoing_ TUTTI_GUARDED_BY(queue_mutex_);
  bool wake_ TUTTI_GUARDED_BY(queue_mutex_) = false;

  // Held around each pass: the RPC thread's, or a waiting caller's (Note [A waiting caller
  // runs the pass] in agent_drive.cc). The members below it to in_progress_ are the pass's.
  tutti::detail::Mutex pass_mutex_;
  std::atomic<int> drivers_{0};  // Callers driving now.
  std::atomic<std::uint64_t> driven_passes_{0};
  // Set by a driven pass: work left for the RPC thread when its driver lets go.
  std::atomic<bool> driven_left_work_{false};
  bool loop_ended_ TUTTI_GUARDED_BY(pass_mutex_) = false;  // No pass runs after the loop's last.
  // This thread is inside a pass (holds pass_mutex_): its call_sync() must not drive.
  static inline thread_local bool in_pass_ = false;
  Status driven_fatal_ TUTTI_GUARDED_BY(pass_mutex_);  // A driven pass's fault, for run().

  // The pass's (above).
  std::deque<std::string> loopback_;
  Reassembler reassembler_;
  std::uint64_t sent_ = 0;
  std::uint64_t received_ = 0;
  bool intent_sent_ = false;
  std::uint64_t probe_round_ = 0;
  bool finished_ = false;
  int intents_ = 0;  // Intents arrived (the leader, rank 0, probes once all have).
  std::uint64_t round_ = 0;
  std::map<int, std::pair<std::uint64_t, std::uint64_t>> reports_, last_reports_;
  std::uint64_t seen_sent_ = 0, seen_received_ = 0;  // sent_, received_ at the last progress.

  // The workers whose Intent has arrived, for shutdown(true)'s warnings.
  tutti::detail::Mutex intents_mutex_;
  std::vector<bool> intended_ TUTTI_GUARDED_BY(intents_mutex_);
  // When the pass last saw the group progress during a graceful shutdown: a request or response
  // sent or received here, or an Intent arrived (Note [Graceful shutdown]).
  std::atomic<Clock::time_point> last_progress_{Clock::time_point{}};

  std::atomic<int> in_progress_{0};  // Requests received and not answered yet.
  std::atomic<bool> graceful_requested_{false};
  std::atomic<bool> force_requested_{false};
  tutti::detail::Mutex state_mutex_;
  tutti::detail::CondVar state_cv_;
  bool loop_done_ TUTTI_GUARDED_BY(state_mutex_) = false;
  tutti::detail::Mutex shutdown_mutex_;
  bool torn_down_ TUTTI_GUARDED_BY(shutdown_mutex_) = false;
};

// The agent of the calling thread: its pool threads' own, or the one a test installed with
// AgentScope; null elsewhere (the public API then uses the process's agent).
Agent* thread_agent();
// RAII: makes `agent` the calling thread's agent (thread-local; the calling thread only).
class AgentScope {
 public:
  explicit AgentScope(Agent* agent);
  ~AgentScope();
  AgentScope(const AgentScope&) = delete;
  AgentScope& operator=(const AgentScope&) = delete;

 private:
  Agent* previous_;
};

}  // namespace tutti::rpc::detail
