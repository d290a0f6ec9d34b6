// SPDX-License-Identifier: Apache-2.0
// The shared state behind rpc::Future and every internal wait of the RPC layer: a Message or the
// Status that failed it, set once, with waiters and callbacks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "src/common/status.h"
#include "tutti/rpc.h"

namespace tutti::rpc::detail {

using Clock = std::chrono::steady_clock;

// A result that arrives later. The RPC agent guarantees that every future it hands out
// completes: with the response, or failed at the call's deadline (Timeout), at shutdown or when
// the callee leaves (ShutDown). Any thread.
class FutureState {
 public:
  FutureState() = default;
  // Already completed.
  static std::shared_ptr<FutureState> ready(Result<Message> result);

  // Sets the result unless one is set already (then returns false and drops `result`), wakes
  // the waiters and runs the callbacks on this thread.
  bool complete(Result<Message> result);
  bool done() const;
  // Blocks until done; a pool thread counts as blocked meanwhile (ThreadPool::Blocking). The
  // reference stays valid for the state's lifetime.
  const Result<Message>& wait();
  // Waits until done or `deadline`; false at the deadline.
  bool wait_until(Clock::time_point deadline);
  // The result; requires done().
  const Result<Message>& result() const { return *result_; }
  // Runs `callback(result)` once done: at once on this thread if it is, else on the thread that
  // completes it (often the RPC thread, so callbacks must not block).
  void then(std::function<void(const Result<Message>&)> callback);

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<Result<Message>> result_;  // Set once, under mutex_; read-only afterwards.
  std::vector<std::function<void(const Result<Message>&)>> callbacks_;  // Guarded by mutex_.
};

// Completes with an empty Message when every one of `futures` has succeeded, or with the first
// failure (in the order given) once all are done.
std::shared_ptr<FutureState> when_all(const std::vector<std::shared_ptr<FutureState>>& futures);

// The back door into rpc::Future.
struct FutureAccess {
  static Future wrap(std::shared_ptr<FutureState> state) {
    Future f;
    f.state_ = std::move(state);
    return f;
  }
};

}  // namespace tutti::rpc::detail
