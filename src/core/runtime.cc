// SPDX-License-Identifier: Apache-2.0
#include "src/core/runtime.h"

#include <cstdint>
#include <cstdlib>

#include "src/base/fast_tls.h"
#include "src/common/logging.h"
#include "src/core/terminate_dump.h"

namespace tutti::core {

Runtime& Runtime::get() {
  // Never destroyed: the exit hook and late threads may still reach it during static teardown.
  static Runtime* runtime = new Runtime();
  return *runtime;
}

Status Runtime::init(const void* parent) {
  detail::MutexLock lock(mutex_);
  if (session_ != nullptr) return Status();
  // A malformed environment does not fail here: every rank's init() must fail alike, so the
  // failure travels through the session's start handshake (Note [Agreed settings]).
  Result<Config> local = Config::from_env();
  const Config& settings = local.ok() ? local.value() : Config{};
  settings.apply_logging();
  TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<ops::Transport> transport,
                         ops::create_mpi_transport(parent, settings.start_timeout));
  detail::set_log_rank(transport->topology().rank);
  detail::warn_unknown_settings();
  TUTTI_ASSIGN_OR_RETURN(session_, Session::create(std::move(local), std::move(transport)));
  generation_.fetch_add(1, std::memory_order_release);
  last_recorder_ = session_->flight_recorder();
  if (!exit_hook_registered_) {
    // Registered after MPI's own finalize hook, so it runs before it: a process that exits
    // without shutdown() is shut down first.
    std::atexit([] { Runtime::get().shutdown(); });
    // An application that finalizes MPI itself with Tutti still running gets a shutdown at the
    // start of its MPI_Finalize, instead of a communication thread calling a finalized MPI.
    ops::set_mpi_finalize_hook([] { Runtime::get().shutdown(); });
    install_terminate_dump();  // Note [An uncaught exception leaves its traces].
    exit_hook_registered_ = true;
  }
  return Status();
}

void Runtime::shutdown() {
  // Outside the lock: the hook (RPC's graceful shutdown) talks to other ranks for a while.
  if (void (*hook)() = before_shutdown_.load()) hook();
  std::shared_ptr<Session> session;
  {
    detail::MutexLock lock(mutex_);
    session = std::move(session_);
    was_shut_down_ = was_shut_down_ || session != nullptr;
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (session) session->stop();
}

bool Runtime::initialized() const {
  detail::MutexLock lock(mutex_);
  return session_ != nullptr;
}

Result<std::shared_ptr<Session>> Runtime::session() const {
  detail::MutexLock lock(mutex_);
  if (session_ == nullptr) {
    return Status(ErrorCode::NotInitialized, "Tutti is not initialized: call tutti::init() first");
  }
  return session_;
}

// Note [Queries without the lock]
// Applications ask rank() and size() in loops (a gradient divided by the number of ranks, a
// shard picked per sample), and each query took the runtime's lock and copied the session's
// shared pointer: 27-33 ns a query, 7 ns now (a loop of rank() and size(), 2 ranks on the
// 2-core AMD EPYC VM of family 26; examples/BENCHMARK_LOG.md, fifty-second round). A session's
// topology never changes, so each thread keeps the last one it read with the generation it
// was current in (Note [Session for an op]) and answers from it while the generation is
// unchanged: one load. A query racing with shutdown() may answer from the session that is
// stopping, as one that took the lock just before it would have.
Result<ops::Topology> Runtime::topology() const {
  struct Known {
    // None known yet: a generation never reached (generation_ is 0 before the first init()).
    std::uint64_t generation = UINT64_MAX;
    ops::Topology topology;
  };
  TUTTI_FAST_TLS thread_local Known known;  // Trivially destructible: no guard.
  if (known.generation == generation_.load(std::memory_order_acquire)) return known.topology;
  detail::MutexLock lock(mutex_);
  if (session_ == nullptr) {
    return Status(ErrorCode::NotInitialized, "Tutti is not initialized: call tutti::init() first");
  }
  known = Known{.generation = generation_.load(std::memory_order_relaxed),
                .topology = session_->topology()};
  return known.topology;
}

}  // namespace tutti::core

namespace tutti::core {

Result<std::shared_ptr<FlightRecorder>> Runtime::flight_recorder() const {
  detail::MutexLock lock(mutex_);
  if (last_recorder_ == nullptr) {
    return Status(ErrorCode::NotInitialized, "Tutti is not initialized: call tutti::init() first");
  }
  return last_recorder_;
}

// Note [Session for an op]
// Every op looks the session up, and under the runtime's lock that was a lock, an unlock and a
// copy of the shared pointer each time: two locked instructions more per op than needed, and
// the pthread calls around them (P3's ops cost about 250 ns each). Each thread keeps a weak
// pointer to the session it last used, with the generation it was current in; while the
// generation is unchanged, locking the weak pointer is the op's one locked instruction to get
// the session. init() and shutdown() change the generation under the lock, so a thread that
// reads a new one takes the lock as before. A thread that read the old generation just as
// shutdown() began either locks the session still alive, which then refuses its op with
// ShutDown, or fails to and takes the lock: the same two outcomes as a thread that took the lock
// just before shutdown() did. The copy holds only the session's control block once it is gone.
Result<std::shared_ptr<Session>> Runtime::session_for_op() const {
  struct Current {
    std::uint64_t generation = 0;  // generation_ starts at 0 with no session.
    std::weak_ptr<Session> session;
  };
  TUTTI_FAST_TLS thread_local Current current;  // Note [Thread-locals read without a call].
  if (current.generation == generation_.load(std::memory_order_acquire)) {
    if (std::shared_ptr<Session> session = current.session.lock()) return session;
  }
  detail::MutexLock lock(mutex_);
  if (session_ != nullptr) {
    current =
        Current{.generation = generation_.load(std::memory_order_relaxed), .session = session_};
    return session_;
  }
  if (was_shut_down_)
    return Status(ErrorCode::ShutDown, "Tutti has shut down; call tutti::init() to start again");
  return Status(ErrorCode::NotInitialized, "Tutti is not initialized: call tutti::init() first");
}

}  // namespace tutti::core
