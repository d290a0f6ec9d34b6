// SPDX-License-Identifier: Apache-2.0
// See Note [Device completion] in device_completions.h.
#include "src/core/execution/device_completions.h"

#include <pthread.h>

namespace tutti::core {
namespace {

// Polling policy while events are pending: yield for a while (a small op's device work
// finishes within tens of microseconds), then sleep in short steps. A sleeping poll adds at
// most kSleep to an op's latency; a spinning one would steal a core from the application.
constexpr std::chrono::microseconds kYieldTime{100};
constexpr std::chrono::microseconds kSleep{50};

}  // namespace

DeviceCompletions::~DeviceCompletions() {
  finish(std::chrono::milliseconds(0), Status(ErrorCode::ShutDown, "Tutti has shut down"));
}

void DeviceCompletions::add(std::unique_ptr<ops::DeviceEvent> event,
                            std::vector<std::shared_ptr<Entry>> entries,
                            std::shared_ptr<void> keep_alive) {
  detail::MutexLock lock(mutex_);
  pending_.push_back(Pending{.event = std::move(event),
                             .entries = std::move(entries),
                             .keep_alive = std::move(keep_alive)});
  pending_count_.store(pending_.size());
  if (!thread_.joinable() && !stop_) thread_ = std::thread([this] { run(); });
  cv_.notify_one();
}

bool DeviceCompletions::busy() const { return pending_count_.load() != 0; }

Status DeviceCompletions::error() const {
  detail::MutexLock lock(mutex_);
  return error_;
}

void DeviceCompletions::fail_pending(const Status& status) {
  for (Pending& pending : pending_) completer_.complete(pending.entries, status);
  pending_.clear();
  pending_count_.store(0);
}

void DeviceCompletions::fail_all(const Status& status) {
  detail::MutexLock lock(mutex_);
  fail_pending(status);
  empty_.notify_all();
}

void DeviceCompletions::finish(std::chrono::milliseconds timeout, const Status& status) {
  std::thread thread;
  {
    detail::MutexLock lock(mutex_);
    if (thread_.joinable()) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      while (!pending_.empty() && empty_.wait_until(mutex_, deadline)) {
      }
    }
    fail_pending(status);
    stop_ = true;
    thread = std::move(thread_);
  }
  cv_.notify_all();
  if (thread.joinable()) thread.join();
}

void DeviceCompletions::run() {
  pthread_setname_np(pthread_self(), "tutti-device");
  detail::MutexLock lock(mutex_);
  auto idle_since = std::chrono::steady_clock::now();
  while (true) {
    while (!stop_ && pending_.empty()) cv_.wait(mutex_);
    if (stop_) return;
    const auto now = std::chrono::steady_clock::now();
    if (complete_ready()) {
      idle_since = now;
      if (pending_.empty()) empty_.notify_all();
      continue;
    }
    // Sleep without the lock, so add() and the communication thread's checks go on.
    mutex_.unlock();
    if (now - idle_since < kYieldTime) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kSleep);
    }
    mutex_.lock();
  }
}

bool DeviceCompletions::complete_ready() {
  bool any = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    Result<bool> done = it->event->poll();
    if (done.ok() && !done.value()) {
      ++it;
      continue;
    }
    if (!done.ok() && error_.ok()) error_ = done.status();
    completer_.complete(it->entries, done.ok() ? Status() : done.status());
    it = pending_.erase(it);
    any = true;
  }
  pending_count_.store(pending_.size());
  return any;
}

}  // namespace tutti::core
