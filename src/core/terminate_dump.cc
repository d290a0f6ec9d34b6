// SPDX-License-Identifier: Apache-2.0
// See Note [An uncaught exception leaves its traces] in terminate_dump.h.
#include "src/core/terminate_dump.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "src/base/strings.h"
#include "src/core/runtime.h"
#include "src/core/session.h"

namespace tutti::core {
namespace {

// How long the traces may take before the process ends anyway (a dump takes milliseconds).
constexpr std::chrono::seconds kTraceDeadline{2};

std::terminate_handler previous_handler = nullptr;

// Why std::terminate() was called, from the exception being handled, if any.
std::string terminate_reason() {
  const std::exception_ptr error = std::current_exception();
  if (!error) return "std::terminate() called without an exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return detail::str_cat("std::terminate(): uncaught exception: ", e.what());
  } catch (...) {
    return "std::terminate(): uncaught exception of a type not derived from std::exception";
  }
}

// The dump and the timeline's end, on a thread of its own, waited for up to kTraceDeadline.
void leave_traces(const std::string& reason) {
  struct Done {
    std::mutex mutex;
    std::condition_variable cv;
    bool finished = false;
  };
  auto done = std::make_shared<Done>();
  std::thread worker([reason, done] {
    const Result<std::shared_ptr<Session>> session = Runtime::get().session();
    if (session.ok()) {
      session.value()->stop_timeline();
      session.value()->dump_after_error(reason);  // "std::terminate(): ..."
    }
    const std::lock_guard<std::mutex> lock(done->mutex);
    done->finished = true;
    done->cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(done->mutex);
  done->cv.wait_for(lock, kTraceDeadline, [&] { return done->finished; });
  lock.unlock();
  worker.detach();  // Finished, or stuck on a lock this thread holds: the process ends anyway.
}

[[noreturn]] void on_terminate() {
  static std::atomic<bool> entered{false};
  if (!entered.exchange(true)) leave_traces(terminate_reason());  // Once, if it recurses.
  if (previous_handler != nullptr) previous_handler();
  std::abort();
}

}  // namespace

void install_terminate_dump() {
  static std::once_flag installed;
  std::call_once(installed, [] { previous_handler = std::set_terminate(on_terminate); });
}

}  // namespace tutti::core
