// SPDX-License-Identifier: Apache-2.0
// coarse_now(): steady_clock's time as of the kernel's last tick, for stamps that are read on
// every op and only ever compared at a human's scale.
//
// Note [Coarse clock]
// A steady_clock::now() is a vDSO clock_gettime(CLOCK_MONOTONIC) that reads the time-stamp
// counter, which on a VM can cost far more than on bare metal: 24 ns on the 2-core AMD EPYC VM
// (tsc clocksource, 10 million reads), where an op of P3 (10,000 tiny allreduces a step) costs
// 330-470 ns in all. CLOCK_MONOTONIC_COARSE reads the time the kernel kept at its last tick
// instead: 5 ns there, with the tick's resolution (4 ms at Linux's usual 250 Hz). It is the same
// clock as steady_clock's (libstdc++ reads CLOCK_MONOTONIC), never ahead of it, so a coarse
// stamp is never later than an exact one taken after it.
#pragma once

#include <time.h>

#include <chrono>

namespace tutti::base {

inline std::chrono::steady_clock::time_point coarse_now() {
#ifdef CLOCK_MONOTONIC_COARSE
  timespec now{};
  if (clock_gettime(CLOCK_MONOTONIC_COARSE, &now) == 0) {
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec)));
  }
#endif
  return std::chrono::steady_clock::now();
}

}  // namespace tutti::base
