// SPDX-License-Identifier: Apache-2.0
// The state a Handle shares with the communication thread: done flag, final Status, outputs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "src/common/status.h"
#include "tutti/tensor.h"

namespace tutti::detail {

// Written once by the communication thread (outputs, then complete()); read by any thread
// after done() or wait() says so.
class OpState {
 public:
  // Communication thread. Must be called exactly once; outputs must be set before.
  void complete(Status status);
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Any thread. Blocks until complete(); returns its Status.
  Status wait();

  Tensor output;
  std::vector<Tensor> outputs;
  std::vector<std::int64_t> received_splits;
  int join_result = -1;

 private:
  std::atomic<bool> done_{false};
  Status status_;  // Written before done_ is set; read after.
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace tutti::detail
