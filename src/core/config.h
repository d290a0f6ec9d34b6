// SPDX-License-Identifier: Apache-2.0
// The session's settings, parsed from the knob table (src/common/knobs.def) by init(). Every
// default comes from that table; Config{} holds them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/hierarchy.h"
#include "ops/transport.h"
#include "src/common/env.h"
#include "src/common/logging.h"
#include "src/common/status.h"

namespace tutti::core {

struct Config {
  std::int64_t fusion_threshold_bytes = detail::knob_default(detail::knob::FUSION_THRESHOLD);
  // TUTTI_FUSION_THRESHOLD was set: with autotune, that threshold is one of the candidates.
  bool fusion_threshold_set = false;
  std::chrono::microseconds cycle_time = ms_to_us(detail::knob_default(detail::knob::CYCLE_TIME));
  bool cycle_time_set = false;  // TUTTI_CYCLE_TIME was set: with autotune, a candidate.
  std::int64_t cache_capacity = detail::knob_default(detail::knob::CACHE_CAPACITY);
  // TUTTI_CACHE_CAPACITY was set: the cache keeps that capacity; unset, it grows to fit the names
  // that recur (Note [Cache growth] in response_cache.h).
  bool cache_capacity_set = false;
  // Bytes of freed CPU tensor storage kept for reuse (Note [Host memory cache]).
  std::int64_t host_memory_cache = detail::knob_default(detail::knob::HOST_MEMORY_CACHE);
  ops::HostTransport host_transport = ops::HostTransport::Auto;
  // Size classes that go over MPI where host_transport is shared memory (TUTTI_HOST_TRANSPORT
  // =shm/mpi or =mpi/shm; autotune chooses them under auto).
  ops::HostRoutes host_routes = 0;
  // SHM_STREAMING_STORES (Note [Streaming stores] in ops/shm/staging.h).
  ops::ShmStores shm_stores = ops::ShmStores::Auto;
  std::string timeline_path;
  bool timeline_mark_cycles = detail::knob_default(detail::knob::TIMELINE_MARK_CYCLES);
  bool stall_check_disabled = detail::knob_default(detail::knob::STALL_CHECK_DISABLE);
  std::chrono::milliseconds stall_check_time =
      seconds_to_ms(detail::knob_default(detail::knob::STALL_CHECK_TIME_SECONDS));
  std::chrono::milliseconds stall_shutdown_time =  // 0 = never.
      seconds_to_ms(detail::knob_default(detail::knob::STALL_SHUTDOWN_TIME_SECONDS));
  // HIERARCHICAL_ALLREDUCE / HIERARCHICAL_ALLGATHER, for sets spanning several hosts: the
  // knob table's default is auto.
  ops::HierarchyOptions hierarchy{.allreduce = ops::HierarchyMode::Auto,
                                  .allgather = ops::HierarchyMode::Auto};
  // TUTTI_AUTOTUNE and its settings (see Note [Autotune] in src/core/tuning/autotune.h).
  bool autotune = detail::knob_default(detail::knob::AUTOTUNE);
  std::string autotune_log;
  int autotune_warmup_samples =
      static_cast<int>(detail::knob_default(detail::knob::AUTOTUNE_WARMUP_SAMPLES));
  int autotune_steps_per_sample =
      static_cast<int>(detail::knob_default(detail::knob::AUTOTUNE_STEPS_PER_SAMPLE));
  int autotune_max_samples =
      static_cast<int>(detail::knob_default(detail::knob::AUTOTUNE_BAYES_OPT_MAX_SAMPLES));
  int num_nccl_streams = static_cast<int>(detail::knob_default(detail::knob::NUM_NCCL_STREAMS));
  // THREAD_AFFINITY: the CPU of each local rank's communication thread; empty = not pinned.
  std::vector<int> thread_affinity;
  std::chrono::milliseconds start_timeout =
      seconds_to_ms(detail::knob_default(detail::knob::START_TIMEOUT));
  std::chrono::milliseconds exit_grace =
      seconds_to_ms(detail::knob_default(detail::knob::EXIT_GRACE_SECONDS));
  std::int64_t flight_recorder_size = detail::knob_default(detail::knob::FLIGHT_RECORDER_SIZE);
  std::string flight_recorder_dir;
  // GRADIENT_GROUPING, resolved against the job's topology by default_gradient_groups().
  enum class GradientGrouping : std::uint8_t { Auto, Each, One };
  GradientGrouping gradient_grouping = GradientGrouping::Auto;
  // TUTTI_DEBUG=DETAIL: the desync check (Note [Desync check] in negotiation/desync_check.h).
  // It turns the response cache off (cache_capacity 0): every request then travels in full.
  bool desync_check = false;
  // The setting that turned it on, as given ("HOROVOD_DEBUG=detail"), for its messages.
  std::string desync_setting;
  // Rank 0's name for this job, sent to every rank by the start handshake (not a knob): dumps
  // carry it so that scripts/tutti-trace tells one job's files from an earlier job's.
  std::string job_id;
  detail::LogLevel log_level = detail::LogLevel::Warning;
  bool log_hide_time = detail::knob_default(detail::knob::LOG_HIDE_TIME);

  // Reads every knob from `source` (the environment by default). InvalidArgument naming the
  // variable for a malformed or out-of-range value, or a knob that is not implemented yet.
  static Result<Config> from_env(const detail::KnobSource& source = {});
  // Makes the log settings the process's (they are process-wide). Any thread.
  void apply_logging() const;

  static std::chrono::microseconds ms_to_us(double ms) {
    return std::chrono::microseconds(static_cast<std::int64_t>(ms * 1000.0));
  }
  // A positive limit under a millisecond is 1 ms, not 0, which means "never" to some knobs.
  static std::chrono::milliseconds seconds_to_ms(double seconds) {
    const auto ms = static_cast<std::int64_t>(seconds * 1000.0);
    return std::chrono::milliseconds(seconds > 0 && ms == 0 ? 1 : ms);
  }
};

}  // namespace tutti::core
