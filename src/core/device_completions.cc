// SPDX-License-Identifier: Apache-2.0
// See Note [Device completion] in device_completions.h.
#include "src/core/device_completions.h"

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
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back(Pending{.event = std::move(event),
                             .entries = std::move(entries),
                             .keep_alive = std::move(keep_alive)});
  pending_count_.store(pending_.size());
  if (!thread_.joinable() && !stop_) thread_ = std::thread([this] { run(); });
  cv_.notify_one();
}

bool DeviceCompletions::busy() const { return pending_count_.load() != 0; }

Status DeviceCompletions::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void DeviceCompletions::fail_all(const Status& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Pending& pending : pending_) complete(pending, status);
  pending_.clear();
  pending_count_.store(0);
  empty_.notify_all();
}

void DeviceCompletions::finish(std::chrono::milliseconds timeout, const Status& status) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (thread_.joinable()) empty_.wait_for(lock, timeout, [this] { return pending_.empty(); });
    for (Pending& pending : pending_) complete(pending, status);
    pending_.clear();
    pending_count_.store(0);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DeviceCompletions::run() {
  pthread_setname_np(pthread_self(), "tutti-device");
  std::unique_lock<std::mutex> lock(mutex_);
  auto idle_since = std::chrono::steady_clock::now();
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
    if (stop_) return;
    const auto now = std::chrono::steady_clock::now();
    if (complete_ready()) {
      idle_since = now;
      if (pending_.empty()) empty_.notify_all();
      continue;
    }
    lock.unlock();
    if (now - idle_since < kYieldTime) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kSleep);
    }
    lock.lock();
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
    complete(*it, done.ok() ? Status() : done.status());
    it = pending_.erase(it);
    any = true;
  }
  pending_count_.store(pending_.size());
  return any;
}

void DeviceCompletions::complete(Pending& pending, const Status& status) {
  for (const std::shared_ptr<Entry>& entry : pending.entries) {
    if (timeline_ != nullptr && timeline_->enabled()) {
      timeline_->op_end(entry->request.name, status.ok() ? "OK" : status.message());
    }
    entry->state->complete(status);
  }
}

}  // namespace tutti::core
