// SPDX-License-Identifier: Apache-2.0
#include "src/core/config.h"

#include "src/common/env.h"
#include "src/common/logging.h"

namespace tutti::core {
namespace {

using detail::str_cat;

Status out_of_range(std::string_view knob, std::string_view rule) {
  const std::optional<detail::EnvSetting> setting = detail::find_setting(knob);
  return invalid_argument(str_cat(setting ? setting->variable : str_cat("TUTTI_", knob), "='",
                                  setting ? setting->value : "", "' ", rule));
}

std::chrono::milliseconds seconds_to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

}  // namespace

Result<Config> Config::from_env() {
  Config c;
  TUTTI_ASSIGN_OR_RETURN(c.fusion_threshold_bytes, detail::int_setting("FUSION_THRESHOLD", c.fusion_threshold_bytes));
  if (c.fusion_threshold_bytes < 0) return out_of_range("FUSION_THRESHOLD", "must be >= 0");
  TUTTI_ASSIGN_OR_RETURN(double cycle_ms, detail::double_setting("CYCLE_TIME", 1.0));
  if (!(cycle_ms >= 0)) return out_of_range("CYCLE_TIME", "must be >= 0 (milliseconds)");
  c.cycle_time = std::chrono::microseconds(static_cast<std::int64_t>(cycle_ms * 1000.0));
  TUTTI_ASSIGN_OR_RETURN(c.cache_capacity, detail::int_setting("CACHE_CAPACITY", c.cache_capacity));
  if (c.cache_capacity < 0) return out_of_range("CACHE_CAPACITY", "must be >= 0");
  c.timeline_path = detail::string_setting("TIMELINE", "");
  TUTTI_ASSIGN_OR_RETURN(c.timeline_mark_cycles, detail::bool_setting("TIMELINE_MARK_CYCLES", false));
  TUTTI_ASSIGN_OR_RETURN(c.stall_check_disabled, detail::bool_setting("STALL_CHECK_DISABLE", false));
  TUTTI_ASSIGN_OR_RETURN(double check_s, detail::double_setting("STALL_CHECK_TIME_SECONDS", 60.0));
  if (!(check_s > 0)) return out_of_range("STALL_CHECK_TIME_SECONDS", "must be > 0");
  c.stall_check_time = seconds_to_ms(check_s);
  TUTTI_ASSIGN_OR_RETURN(double shutdown_s, detail::double_setting("STALL_SHUTDOWN_TIME_SECONDS", 600.0));
  if (!(shutdown_s >= 0)) return out_of_range("STALL_SHUTDOWN_TIME_SECONDS", "must be >= 0");
  c.stall_shutdown_time = seconds_to_ms(shutdown_s);
  TUTTI_ASSIGN_OR_RETURN(bool autotune, detail::bool_setting("AUTOTUNE", false));
  static_cast<void>(autotune);  // Parsed so a typo fails init(); tuning itself is not built yet.
  TUTTI_ASSIGN_OR_RETURN(c.hierarchical_allreduce, detail::bool_setting("HIERARCHICAL_ALLREDUCE", false));
  TUTTI_ASSIGN_OR_RETURN(c.hierarchical_allgather, detail::bool_setting("HIERARCHICAL_ALLGATHER", false));
  TUTTI_ASSIGN_OR_RETURN(std::int64_t streams, detail::int_setting("NUM_NCCL_STREAMS", 1));
  if (streams < 1 || streams > 64) return out_of_range("NUM_NCCL_STREAMS", "must be in 1..64");
  c.num_nccl_streams = static_cast<int>(streams);
  c.thread_affinity = detail::string_setting("THREAD_AFFINITY", "");

  const std::string level_text = detail::string_setting("LOG_LEVEL", "WARNING");
  detail::LogLevel level = detail::LogLevel::Warning;
  if (!detail::parse_log_level(level_text, &level)) {
    return out_of_range("LOG_LEVEL", "is not one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL");
  }
  TUTTI_ASSIGN_OR_RETURN(bool hide_time, detail::bool_setting("LOG_HIDE_TIME", false));
  detail::set_log_level(level);
  detail::set_log_hide_time(hide_time);
  detail::warn_unknown_settings();
  return c;
}

}  // namespace tutti::core
