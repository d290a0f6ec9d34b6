// SPDX-License-Identifier: Apache-2.0
// The process-wide runtime behind API.md's free functions.
//
// Note [One runtime]
// All process state lives in the one Runtime; API.md's free functions forward to it. init()
// creates a Session, shutdown() stops and drops it, and init() may create a new one. Calls
// hold a shared_ptr to the Session they use, so a concurrent shutdown() cannot free it under
// them; they then see ShutDown.
#pragma once

#include <memory>
#include <mutex>

#include "src/common/status.h"
#include "src/core/session.h"

namespace tutti::core {

class Runtime {
 public:
  static Runtime& get();

  // Application thread. `parent` is an MPI_Comm* or null for MPI_COMM_WORLD.
  Status init(const void* parent);
  void shutdown();
  bool initialized() const;
  // The current session, or NotInitialized (for queries, which API.md says throw that).
  Result<std::shared_ptr<Session>> session() const;
  // The current session for submitting an op: NotInitialized before the first init(),
  // ShutDown after shutdown() (API.md: every new op fails with ShutDown), or the session,
  // which itself refuses ops with ShutDown once it stopped after a fault or stall.
  Result<std::shared_ptr<Session>> session_for_op() const;

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<Session> session_;  // Guarded by mutex_.
  bool exit_hook_registered_ = false;
  bool was_shut_down_ = false;  // Guarded by mutex_.
};

}  // namespace tutti::core
