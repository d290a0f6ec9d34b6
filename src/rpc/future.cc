// SPDX-License-Identifier: Apache-2.0
#include "src/rpc/future.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "src/rpc/thread_pool.h"

namespace tutti::rpc::detail {

std::shared_ptr<FutureState> FutureState::ready(Result<Message> result) {
  auto state = std::make_shared<FutureState>();
  state->complete(std::move(result));
  return state;
}

bool FutureState::complete(Result<Message> result) {
  std::vector<std::function<void(const Result<Message>&)>> callbacks;
  {
    const tutti::detail::MutexLock lock(mutex_);
    if (result_) return false;
    result_.emplace(std::move(result));
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  for (auto& callback : callbacks) callback(completed());
  return true;
}

void FutureState::set_deadline(Clock::time_point deadline, Status timeout) {
  const tutti::detail::MutexLock lock(mutex_);
  deadline_ = deadline;
  timeout_ = std::move(timeout);
}

bool FutureState::expire_if_due() {
  Status timeout;
  {
    const tutti::detail::MutexLock lock(mutex_);
    if (result_) return true;
    if (!deadline_ || Clock::now() < *deadline_) return false;
    timeout = timeout_;
  }
  complete(std::move(timeout));  // Outside the lock: it runs the callbacks.
  return true;
}

bool FutureState::done() { return expire_if_due(); }

const Result<Message>& FutureState::wait() {
  while (!wait_until(Clock::time_point::max())) {
  }
  return completed();
}

bool FutureState::wait_until(Clock::time_point deadline) {
  if (expire_if_due()) return true;
  ThreadPool::Blocking blocking;  // A nested call: let the pool start a helper meanwhile.
  while (true) {
    {
      const tutti::detail::MutexLock lock(mutex_);
      const Clock::time_point until = deadline_ ? std::min(deadline, *deadline_) : deadline;
      while (!result_.has_value()) {
        if (until == Clock::time_point::max()) {
          cv_.wait(mutex_);
        } else if (!cv_.wait_until(mutex_, until)) {
          break;
        }
      }
      if (result_) return true;
    }
    if (expire_if_due()) return true;  // The call's own deadline came first.
    if (Clock::now() >= deadline) return false;
  }
}

void FutureState::then(std::function<void(const Result<Message>&)> callback) {
  {
    const tutti::detail::MutexLock lock(mutex_);
    if (!result_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback(completed());
}

std::shared_ptr<FutureState> when_all(const std::vector<std::shared_ptr<FutureState>>& futures) {
  auto all = std::make_shared<FutureState>();
  if (futures.empty()) {
    all->complete(Message{});
    return all;
  }
  struct Join {
    std::atomic<std::size_t> left;
    std::vector<std::shared_ptr<FutureState>> futures;
  };
  auto join = std::make_shared<Join>();
  join->left = futures.size();
  join->futures = futures;
  for (const auto& future : futures) {
    future->then([join, all](const Result<Message>&) {
      if (join->left.fetch_sub(1) != 1) return;
      for (const auto& f : join->futures) {
        if (!f->result().ok()) {
          all->complete(f->result().status());
          return;
        }
      }
      all->complete(Message{});
    });
  }
  return all;
}

}  // namespace tutti::rpc::detail
