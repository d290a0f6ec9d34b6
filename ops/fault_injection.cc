// SPDX-License-Identifier: Apache-2.0
#include "ops/fault_injection.h"

#include <atomic>

namespace tutti::ops {
namespace {

std::atomic<int> g_countdown{0};  // 0: no fault armed.

}  // namespace

void inject_allreduce_fault(int nth) { g_countdown.store(nth > 0 ? nth : 0); }

Status take_allreduce_fault() {
  int left = g_countdown.load();
  while (left > 0 && !g_countdown.compare_exchange_weak(left, left - 1)) {
  }
  if (left != 1) return Status();
  return Status(ErrorCode::Communication, "injected transport fault (test)");
}

}  // namespace tutti::ops
