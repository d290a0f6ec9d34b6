// SPDX-License-Identifier: Apache-2.0
// The process-wide runtime behind API.md's free functions.
//
// Note [One runtime]
// All process state lives in the one Runtime; API.md's free functions forward to it. init()
// creates a Session, shutdown() stops and drops it, and init() may create a new one. Calls
// hold a shared_ptr to the Session they use, so a concurrent shutdown() cannot free it under
// them; they then see ShutDown.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "ops/transport.h"
#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/core/session.h"

namespace tutti::core {

class Runtime {
 public:
  static Runtime& get();  // Any thread.

  // Application thread. `parent` is an MPI_Comm* or null for MPI_COMM_WORLD.
  Status init(const void* parent) TUTTI_EXCLUDES(mutex_);
  void shutdown() TUTTI_EXCLUDES(mutex_);
  bool initialized() const TUTTI_EXCLUDES(mutex_);  // Any thread, as the accessors below.
  // The current session, or NotInitialized (for queries, which API.md says throw that).
  Result<std::shared_ptr<Session>> session() const TUTTI_EXCLUDES(mutex_);
  // The current session for submitting an op: NotInitialized before the first init(),
  // ShutDown after shutdown() (API.md: every new op fails with ShutDown), or the session,
  // which itself refuses ops with ShutDown once it stopped after a fault or stall.
  Result<std::shared_ptr<Session>> session_for_op() const TUTTI_EXCLUDES(mutex_);
  // The current session's topology, or NotInitialized (API.md's queries: rank(), size(), ...).
  // No lock while the thread's last answer is current (Note [Queries without the lock]).
  Result<ops::Topology> topology() const TUTTI_EXCLUDES(mutex_);
  // The current or, after shutdown(), the last session's flight recorder (tutti/debug.h);
  // NotInitialized before the first init().
  Result<std::shared_ptr<FlightRecorder>> flight_recorder() const TUTTI_EXCLUDES(mutex_);

  // Any thread. `hook` (null: none) runs at the start of every shutdown(), before the session
  // stops: src/rpc stops an RPC agent that is still running there, since the agent uses the
  // session's RPC plane (Note [RPC threading] in src/rpc/agent.h). The hook must be idempotent.
  void set_before_shutdown(void (*hook)()) { before_shutdown_.store(hook); }

 private:
  mutable detail::Mutex mutex_;
  std::shared_ptr<Session> session_ TUTTI_GUARDED_BY(mutex_);
  std::shared_ptr<FlightRecorder> last_recorder_ TUTTI_GUARDED_BY(mutex_);
  bool exit_hook_registered_ TUTTI_GUARDED_BY(mutex_) = false;
  bool was_shut_down_ TUTTI_GUARDED_BY(mutex_) = false;
  // Counts the changes of session_ (written under mutex_): a thread's copy of the session it
  // last submitted to is current while this is unchanged (Note [Session for an op]).
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<void (*)()> before_shutdown_{nullptr};
};

}  // namespace tutti::core
