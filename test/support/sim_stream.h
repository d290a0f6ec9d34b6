// SPDX-License-Identifier: Apache-2.0
// One stream of the simulated device (test/support/sim_device.h): a worker thread that runs
// its tasks in order, each after a random delay, with events at task positions.
#pragma once

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>

#include "ops/device_ops.h"
#include "src/base/strings.h"

namespace tutti::test {

// One DeviceStream: a worker thread running tasks in FIFO order, each after a random delay.
// Tasks are counted from 1 in enqueue order; "position p has run" means tasks 1..p have.
class SimStream {
 public:
  // An event at a position of one stream. Holds the stream, so it works after the device's
  // destruction (which ran every task).
  class Event final : public ops::DeviceEvent {
   public:
    Event(std::shared_ptr<SimStream> stream, std::uint64_t position)
        : stream_(std::move(stream)), position_(position) {}
    Result<bool> poll() override { return stream_->has_run(position_); }
    Status wait() override {
      stream_->wait(position_);
      return Status();
    }
    // What a stream that waits for this event waits for (SimDeviceOps::wait_event).
    const std::shared_ptr<SimStream>& stream() const { return stream_; }
    std::uint64_t position() const { return position_; }

   private:
    std::shared_ptr<SimStream> stream_;
    std::uint64_t position_;
  };

  SimStream(ops::DeviceStream key, std::chrono::microseconds max_delay)
      : max_delay_(max_delay),
        // Seeded by the stream, so a failing test replays the same delays (threads allowing).
        random_(static_cast<unsigned>(key.device.index * 1009 + key.index)),
        worker_([this, name = detail::str_cat("sim-cuda", key.device.index, ".", key.index)](
                    const std::stop_token& stop) { run(stop, name); }) {}
  ~SimStream() { stop(); }
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  // Queues `task`; returns its position.
  std::uint64_t enqueue(std::function<void()> task) {
    std::uint64_t position = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
      position = ++enqueued_;
    }
    work_.notify_one();
    return position;
  }
  std::uint64_t enqueued() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return enqueued_;
  }
  bool has_run(std::uint64_t position) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_ >= position;
  }
  // Blocks (no spinning) until has_run(position).
  void wait(std::uint64_t position) const {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return completed_ >= position; });
  }
  void set_paused(bool paused) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      is_paused_ = paused;
    }
    work_.notify_one();
  }
  // Runs every queued task, paused or not, and joins the worker. Idempotent.
  void stop() {
    if (!worker_.joinable()) return;
    worker_.request_stop();
    worker_.join();
  }

 private:
  void run(const std::stop_token& stop, const std::string& name) {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());  // Linux's limit.
    std::uniform_int_distribution<std::int64_t> delay(0, max_delay_.count());
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // Once stopped, the predicate no longer holds the worker: queued work runs unpaused.
        work_.wait(lock, stop, [this] { return !tasks_.empty() && !is_paused_; });
        if (tasks_.empty()) return;  // Stopped, and nothing left.
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      if (max_delay_.count() > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(delay(random_)));
      task();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++completed_;
      }
      done_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable_any work_;         // The worker waits: a task, resume() or stop().
  mutable std::condition_variable done_;     // wait() waits: a task ran.
  std::deque<std::function<void()>> tasks_;  // Guarded by mutex_.
  std::uint64_t enqueued_ = 0;               // Guarded by mutex_.
  std::uint64_t completed_ = 0;              // Guarded by mutex_.
  bool is_paused_ = false;                   // Guarded by mutex_.
  const std::chrono::microseconds max_delay_;
  std::mt19937 random_;  // The worker's.
  std::jthread worker_;  // Last: starts once the members above exist.
};

}  // namespace tutti::test
