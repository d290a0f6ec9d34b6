// SPDX-License-Identifier: Apache-2.0
// The session's settings, parsed once from the environment by init() (see src/common/env.cc
// for the table of knobs).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "src/common/status.h"

namespace tutti::core {

// Chosen from examples/allreduce_benchmark's P1 sweep on 2 ranks (see README, Benchmarks).
inline constexpr std::int64_t kDefaultFusionThresholdBytes = 1024 * 1024;

struct Config {
  std::int64_t fusion_threshold_bytes = kDefaultFusionThresholdBytes;
  std::chrono::microseconds cycle_time{1000};
  std::int64_t cache_capacity = 1024;
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  bool stall_check_disabled = false;
  std::chrono::milliseconds stall_check_time{60'000};
  std::chrono::milliseconds stall_shutdown_time{600'000};  // 0 = never.
  bool hierarchical_allreduce = false;
  bool hierarchical_allgather = false;
  int num_nccl_streams = 1;
  std::string thread_affinity;

  // Reads every knob; InvalidArgument naming the variable for a malformed or out-of-range
  // value. Also applies the log settings.
  static Result<Config> from_env();
};

}  // namespace tutti::core
