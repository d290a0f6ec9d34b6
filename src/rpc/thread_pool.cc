// SPDX-License-Identifier: Apache-2.0
#include "src/rpc/thread_pool.h"

#include <utility>

namespace tutti::rpc::detail {
namespace {

thread_local ThreadPool* t_pool = nullptr;  // The pool the calling thread works for.
thread_local int t_blocking_depth = 0;      // Nested Blocking scopes on this thread.

}  // namespace

ThreadPool::ThreadPool(int threads) : target_(threads < 1 ? 1 : threads) {
  const tutti::detail::MutexLock lock(mutex_);
  for (int i = 0; i < target_; ++i) spawn();
}

ThreadPool::~ThreadPool() { stop(); }

void ThreadPool::spawn() {
  ++alive_;
  std::thread thread([this] { work(); });
  const std::thread::id id = thread.get_id();
  threads_.emplace(id, std::move(thread));
}

void ThreadPool::submit(std::function<void()> task) {
  bool queued = false;
  {
    const tutti::detail::MutexLock lock(mutex_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      queued = true;
    }
  }
  // After the lock: a worker woken while it is held may run at once (the scheduler favours a
  // thread that slept) only to block on it, two more context switches on a shared CPU.
  if (queued) cv_.notify_one();
  // A `task` not queued is destroyed here, outside the lock: it may own things whose
  // destructors call back.
}

bool ThreadPool::idle() const {
  const tutti::detail::MutexLock lock(mutex_);
  return tasks_.empty() && running_ == 0;
}

bool ThreadPool::on_pool_thread() { return t_pool != nullptr; }

void ThreadPool::work() {
  t_pool = this;
  // Locked by hand, not by a MutexLock: the lock is dropped around each task, and clang 14's
  // analysis cannot follow a scoped lock released in the middle of its scope.
  mutex_.lock();
  while (!stopping_) {
    if (!tasks_.empty() && running_ - blocked_ < target_) {
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
      mutex_.unlock();
      task();
      task = nullptr;  // Destroyed before the lock is taken again.
      mutex_.lock();
      --running_;
      continue;
    }
    if (alive_ - blocked_ > target_) break;  // A surplus helper: its blocked peer came back.
    cv_.wait(mutex_);
  }
  --alive_;
  if (!stopping_) finished_.push_back(std::this_thread::get_id());
  t_pool = nullptr;
  mutex_.unlock();
}

void ThreadPool::join_finished() {
  std::vector<std::thread> done;
  {
    const tutti::detail::MutexLock lock(mutex_);
    for (const std::thread::id& id : finished_) {
      auto it = threads_.find(id);
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    finished_.clear();
  }
  for (std::thread& t : done) t.join();
}

void ThreadPool::stop() {
  std::deque<std::function<void()>> dropped;
  std::map<std::thread::id, std::thread> threads;
  {
    const tutti::detail::MutexLock lock(mutex_);
    stopping_ = true;
    dropped.swap(tasks_);
    threads.swap(threads_);
    finished_.clear();
    cv_.notify_all();
  }
  dropped.clear();
  for (auto& [id, thread] : threads) thread.join();
}

ThreadPool::Blocking::Blocking() : pool_(t_blocking_depth++ == 0 ? t_pool : nullptr) {
  if (pool_ == nullptr) return;
  pool_->join_finished();
  const tutti::detail::MutexLock lock(pool_->mutex_);
  ++pool_->blocked_;
  if (pool_->stopping_) return;
  if (pool_->alive_ - pool_->blocked_ < pool_->target_ && pool_->alive_ < kMaxThreads) {
    pool_->spawn();
  } else {
    pool_->cv_.notify_one();  // An idle worker may now take a queued task.
  }
}

ThreadPool::Blocking::~Blocking() {
  --t_blocking_depth;
  if (pool_ == nullptr) return;
  const tutti::detail::MutexLock lock(pool_->mutex_);
  --pool_->blocked_;
}

}  // namespace tutti::rpc::detail
