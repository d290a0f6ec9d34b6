// SPDX-License-Identifier: Apache-2.0
#include "src/core/op_state.h"

#include <chrono>
#include <thread>

#include "src/common/check.h"
#include "src/common/mutex.h"

namespace tutti::detail {
namespace {

std::atomic<int> app_waiters{0};     // See app_threads_waiting().
std::atomic<bool> wait_spins{true};  // See set_wait_spins().
// How long wait() drives an op itself before it leaves it to the communication thread (Notes [A
// waiting thread drives point-to-point] in execution/p2p_engine.h and [A waiting thread runs
// the cycle] in loop_driver.h): long enough for a small op's round trip on a loaded host,
// short enough that a wait for a late peer soon costs no CPU beyond the communication
// thread's own polling.
constexpr std::chrono::microseconds kDriveTime{200};

// Note [Drivers by kind]
// An op names the kind of driver a waiting thread may use, and the driver is looked up only
// when a thread waits on (or polls, or drives) an op that is not done. Each op held a weak
// pointer to its session's driver instead: two locked instructions per op to copy and drop it,
// and 16 bytes in every op's record, for a pointer most ops never used (a step's ops are nearly
// all done by the time they are waited on). One session runs at a time, and its ops are all
// done before it is gone (a stopping session fails those it did not run), so the running
// session's drivers are the ones of every op not done. The table is read under its lock, on the
// slow path only.
struct Drivers {
  Mutex mutex;
  std::weak_ptr<Driver> loop TUTTI_GUARDED_BY(mutex);
  std::weak_ptr<Driver> point_to_point TUTTI_GUARDED_BY(mutex);
};

Drivers& drivers() {
  static Drivers* table = new Drivers();  // Never destroyed: waits may outlive static teardown.
  return *table;
}

std::shared_ptr<Driver> driver_of(DriverKind kind) {
  if (kind == DriverKind::None) return nullptr;
  Drivers& table = drivers();
  MutexLock lock(table.mutex);
  return kind == DriverKind::Loop ? table.loop.lock() : table.point_to_point.lock();
}

}  // namespace

void set_drivers(std::weak_ptr<Driver> loop, std::weak_ptr<Driver> point_to_point) {
  Drivers& table = drivers();
  MutexLock lock(table.mutex);
  table.loop = std::move(loop);
  table.point_to_point = std::move(point_to_point);
}

const OpResults OpState::kNoResults;

bool app_threads_waiting() { return app_waiters.load(std::memory_order_relaxed) > 0; }
void set_wait_spins(bool spins) { wait_spins.store(spins, std::memory_order_relaxed); }

// complete() and wait() are a Dekker pair on (done_, sleepers_), both sequentially consistent:
// complete() stores done_ then reads sleepers_; a sleeper counts itself in sleepers_ then reads
// done_. At least one of them sees the other's store, so either the sleeper finds done_ set and
// does not sleep, or complete() sees it and wakes it. The wake cannot fall between the
// sleeper's check and its sleep: done_.wait(0) sleeps only while done_ still holds 0, which the
// kernel checks and sleeps on in one step (a futex), and complete() stored 1 before it wakes.
void OpState::complete(Status status) {
  TUTTI_CHECK(!done(), "an op was completed twice");
  status_ = std::move(status);
  done_.store(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  done_.notify_all();
}

bool OpState::poll() const {
  if (done()) return true;
  if (std::shared_ptr<Driver> by = driver_of(driver)) by->poll();
  return done();
}

void OpState::drive_until(Driver& by, std::chrono::steady_clock::time_point until) const {
  // The clock every few steps: a step of a point-to-point op is a probe of MPI, some 100 ns,
  // and a clock read costs a quarter of that on a VM (Note [Coarse clock] in
  // src/base/coarse_clock.h), while the deadline is hundreds of microseconds away. P6 on the
  // 2-core AMD EPYC VM: 1.08-1.10 us one way against 1.15-1.20 reading it every step (together
  // with the coarse stamps of p2p.cc and P2PEngine::drive(); eight alternated pairs).
  for (unsigned step = 0; !done(); ++step) {
    if (step % kStepsPerClockRead == 0 && std::chrono::steady_clock::now() >= until) return;
    by.drive();
  }
}

bool OpState::drive_for(std::chrono::microseconds time) const {
  if (done()) return true;
  const std::shared_ptr<Driver> by = driver_of(driver);
  if (!by) return false;
  by->take_over();
  drive_until(*by, std::chrono::steady_clock::now() + time);
  by->let_go();
  return done();
}

Status OpState::wait() const {
  if (done()) return status_;
  // Not counted in app_waiters: the communication thread need not poll for this thread while
  // it drives the op itself.
  const std::shared_ptr<Driver> by = driver_of(driver);
  if (by) {
    by->take_over();
    drive_until(*by, std::chrono::steady_clock::now() + kDriveTime);
    if (done()) {
      by->let_go();
      return status_;
    }
  }
  // While this thread waits, the communication thread polls for it (idle_policy.h).
  // Counted before the hand-back, so that the loop it wakes sees a waiter.
  app_waiters.fetch_add(1, std::memory_order_relaxed);
  if (by) by->hand_back();
  // A short spin first where the communication thread has a CPU of its own: a small op
  // finishes within microseconds, and a futex sleep and wake-up would double its latency.
  // Where the two share a CPU the spin only takes turns with the thread it waits for, so this
  // thread sleeps at once (Note [Waiting on a shared CPU] in background_loop.h).
  if (wait_spins.load(std::memory_order_relaxed)) {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    while (!done() && std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
  }
  if (!done()) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    while (done_.load(std::memory_order_seq_cst) == 0) done_.wait(0, std::memory_order_seq_cst);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
  app_waiters.fetch_sub(1, std::memory_order_relaxed);
  return status_;
}

}  // namespace tutti::detail
