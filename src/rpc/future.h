// SPDX-License-Identifier: Apache-2.0
// The shared state behind rpc::Future and every internal wait of the RPC layer: a Message or the
// Status that failed it, set once, with waiters and callbacks.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/common/thread_annotations.h"
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
  bool done();
  // The call's deadline, set by the agent before it hands the future out: whoever waits for it
  // (wait(), wait_until(), done()) past `deadline` completes it with `timeout` itself. The RPC
  // thread also fails calls at their deadlines, but it may be late (a loaded machine, a big
  // frame in transit); a waiter's own wake-up is what keeps a Timeout within its bound.
  void set_deadline(Clock::time_point deadline, Status timeout);
  // Blocks until done (or the deadline: then Timeout); a pool thread counts as blocked
  // meanwhile (ThreadPool::Blocking). The reference stays valid for the state's lifetime.
  const Result<Message>& wait();
  // Waits until done or `deadline`; false at `deadline` if the future is not done by then.
  bool wait_until(Clock::time_point deadline);
  // The result; requires done().
  const Result<Message>& result() const { return completed(); }
  // Runs `callback(result)` once done: at once on this thread if it is, else on the thread that
  // completes it (often the RPC thread, so callbacks must not block).
  void then(std::function<void(const Result<Message>&)> callback);

 private:
  // *result_ once it is set. Set once, under mutex_, and read-only afterwards, so reads after
  // a locked check found it set need no lock; the analysis cannot see that, hence the
  // exemption.
  const Result<Message>& completed() const TUTTI_NO_THREAD_SAFETY_ANALYSIS { return *result_; }

  mutable tutti::detail::Mutex mutex_;
  tutti::detail::CondVar cv_;
  // Completes with the deadline's Timeout if the deadline has passed and nothing else came
  // first; true if done afterwards.
  bool expire_if_due();

  std::optional<Result<Message>> result_ TUTTI_GUARDED_BY(mutex_);
  std::optional<Clock::time_point> deadline_ TUTTI_GUARDED_BY(mutex_);
  Status timeout_ TUTTI_GUARDED_BY(mutex_);
  std::vector<std::function<void(const Result<Message>&)>> callbacks_ TUTTI_GUARDED_BY(mutex_);
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
