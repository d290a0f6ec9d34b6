// SPDX-License-Identifier: Apache-2.0
// One initialized run of Tutti, from init() to shutdown(): it owns the transport, the queue,
// the process-set table, the timeline, the stages of the cycle and the communication thread
// that runs them (Note [Threading model] and Note [The cycle] in background_loop.h).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "ops/transport.h"
#include "src/common/status.h"
#include "src/core/background_loop.h"
#include "src/core/completer.h"
#include "src/core/config.h"
#include "src/core/execution/device_path.h"
#include "src/core/execution/p2p_engine.h"
#include "src/core/flight_recorder.h"
#include "src/core/process_set_table.h"
#include "src/core/signal_dump.h"
#include "src/core/sigpipe_guard.h"
#include "src/core/tensor_queue.h"
#include "src/core/timeline.h"

namespace tutti::core {

class Session {
 public:
  // Application thread, collective (see init()): agrees the settings with every rank
  // (Note [Agreed settings] in start_handshake.h), builds the global set and starts the
  // communication thread. `local` is this rank's own Config, or why it has none: then every
  // rank's create() fails alike.
  static Result<std::shared_ptr<Session>> create(Result<Config> local,
                                                 std::unique_ptr<ops::Transport> transport);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Any thread.
  const ops::Topology& topology() const { return transport_->topology(); }
  const Config& config() const { return config_; }

  // Any thread. Queues an op (argument checks are the caller's); ShutDown once stopped.
  Status submit(std::shared_ptr<Entry> entry);
  // Any thread. Queues point-to-point ops (all or none; checks are the caller's); ShutDown
  // once stopped. `caller_waits`: the calling thread waits on the op (one) at once (Note [Waking
  // the loop for point-to-point] in execution/p2p_engine.h).
  Status submit_p2p(std::vector<P2POpEntry> ops, bool caller_waits = false);
  // Any thread. The set, or InvalidArgument if unknown. The global set, which every op of most
  // programs names, without the table's lock.
  Result<SetInfo> process_set(int id) const {
    return id == 0 ? Result<SetInfo>(global_set_) : sets_.find(id);
  }
  // Any thread. Set 0, which never changes, for the ops that name it (most) without a Result:
  // the SetInfo copied out of one just built was read back across two of its stores, a load
  // that waited for both (half the submission's constructor's samples in P3 on the AMD EPYC
  // VM, about 1 % of the step; examples/BENCHMARK_LOG.md, fourteenth round).
  const SetInfo& global_set() const { return global_set_; }
  // Any thread. See DevicePath::claim().
  Status claim_device(Device device) { return device_.claim(device); }
  // Any thread. Numbers this rank's add_process_set()/remove_process_set() calls (0, 1, ...),
  // which every rank makes in the same order, so the n-th call has the same name everywhere.
  std::uint64_t next_set_change() { return set_changes_.fetch_add(1); }

  // Application thread, collective: asks every rank to stop, finishes what was negotiated,
  // fails the rest with ShutDown and joins the communication thread. Idempotent.
  void stop();
  // Any thread. Starts (rank 0) or replaces the timeline; a no-op on other ranks, which
  // record nothing. InvalidArgument if rank 0 cannot open `path`.
  Status start_timeline(const std::string& path, bool mark_cycles);
  // Rank 0: starts TUTTI_TIMELINE's file, or continues it where an earlier session of this
  // process left it (Note [One TUTTI_TIMELINE file per process] in session.cc).
  Status start_env_timeline();
  void stop_timeline() { timeline_.stop(); }
  // Any thread. Writes the flight recorder's dump after the runtime stopped for `reason` (Note
  // [Flight recorder]; error_reason() words an error), or the process is ending for it (Note [An
  // uncaught exception leaves its traces] in terminate_dump.h), and says where in the log.
  void dump_after_error(std::string_view reason);
  // A dump's reason for `why`: its error's name, then its message ("Mismatch: desync in ...",
  // "Stalled: ops were submitted by some ranks but not by others ..."; a message that starts
  // with the name already keeps that one).
  static std::string error_reason(const Status& why);
  // Any thread. This rank's flight recorder (tutti/debug.h), which outlives the session.
  const std::shared_ptr<FlightRecorder>& flight_recorder() const { return recorder_; }

  // Whether the communication thread has ended (stop(), a fault, a stall).
  bool stopped() const { return loop_done_.load(); }

  // Any thread. The control plane reserved for the RPC agent (src/rpc), taken from the
  // transport when the session was created; null if the transport has none. The session owns
  // it and never uses it: one agent at a time drives it from its own thread while holding the
  // session alive (see Note [RPC threading] in src/rpc/agent.h).
  ops::ControlPlane* rpc_plane() const { return rpc_plane_.get(); }
  // Any thread. Whether application threads may make MPI calls of the threads that serve them
  // while they wait (the collectives' cycle, point-to-point, the RPC agent's pass): MPI allows
  // it, and ranks do not outnumber the host's CPUs.
  bool waiting_threads_may_drive() const;

 private:
  Session(Config config, std::unique_ptr<ops::Transport> transport);
  // The communication thread's body.
  void run();
  // Fails every op still pending with the reason the loop ended.
  void finish(const Status& status);

  // Declared in dependency order: each member is built from those above it and destroyed
  // before them.
  const Config config_;
  // Before the transport: SIGPIPE stays ignored until the transport is gone (Note [SIGPIPE
  // while a session runs] in sigpipe_guard.h).
  const SigpipeGuard sigpipe_guard_;
  std::unique_ptr<ops::Transport> transport_;
  // Lent to src/rpc (see rpc_plane()); its own communicator, used by the RPC agent's thread.
  std::unique_ptr<ops::ControlPlane> rpc_plane_;
  // Shared with Runtime, which keeps the last session's after shutdown() (tutti/debug.h).
  std::shared_ptr<FlightRecorder> recorder_;
  Timeline timeline_;  // Rank 0 writes it (see Timeline).
  Completer completer_;
  TensorQueue queue_;
  ProcessSetTable sets_;
  SetInfo global_set_;  // Set 0: filed before the communication thread starts, never removed.
  DevicePath device_;
  P2PQueue p2p_queue_;
  const CpuSharing sharing_;  // Note [Waiting on a shared CPU] in background_loop.h.
  // Shared with the point-to-point ops that a waiting thread may drive (Note [A waiting thread
  // drives point-to-point] in execution/p2p_engine.h).
  std::shared_ptr<P2PEngine> p2p_;
  // Shared with the collectives that a waiting thread may run the cycle for (Note [A waiting
  // thread runs the cycle] in loop_driver.h).
  std::shared_ptr<LoopDriver> loop_driver_;
  // Application threads share the communication thread's CPU and may run its cycle: each
  // keeps its backlog short (Note [A submitting thread keeps its backlog short] in
  // submission_window.h).
  const bool keeps_backlog_short_ = loop_driver_->enabled() && sharing_.shares_cpu;
  BackgroundLoop loop_;  // Communication thread only, but for the cycles loop_driver_ runs.
  std::optional<SignalDumper> signal_dumper_;  // While the flight recorder records.

  std::atomic<std::uint64_t> set_changes_{0};
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> stopped_on_error_{false};  // Set by finish(): the job stopped on an error.
  // What submissions get once the loop has ended (Session::finish()): written by finish() on
  // the communication thread before it sets loop_done_, read only after loop_done_ is seen.
  Status refused_;
  std::atomic<bool> loop_done_{false};
  std::thread thread_;  // Started by create(), joined by stop().
  // The coordinator's, where ranks of its host ring it: ends the communication thread's nap at
  // each ring (Note [Doorbell] in ops/mpi/doorbell.h). Started by create(), joined by stop().
  std::thread doorbell_thread_;
  // Likewise where ranks on other hosts ring it over UDP (Note [Net bell] in ops/mpi/net_bell.h).
  std::thread net_bell_thread_;
};

}  // namespace tutti::core
