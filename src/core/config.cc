// SPDX-License-Identifier: Apache-2.0
#include "src/core/config.h"

#include <charconv>

#include "ops/device_ops.h"
#include "ops/registry.h"

namespace tutti::core {
namespace {

using detail::str_cat;

Status refuse(const detail::KnobSource& source, std::string_view knob, std::string_view why) {
  const std::optional<detail::EnvSetting> setting = source.find(knob);
  return invalid_argument(str_cat(setting ? setting->variable : str_cat("TUTTI_", knob), "='",
                                  setting ? setting->value : "", "' ", why));
}

// HIERARCHICAL_* (ops/hierarchy.h) and SHM_STREAMING_STORES: "auto" (the default) or a boolean.
Result<ops::HierarchyMode> hierarchy_mode(const detail::KnobSource& source,
                                          detail::KnobId<detail::KnobType::String> knob) {
  const std::string text = detail::knob_value(knob, source);
  if (text == "auto" || text == "AUTO" || text == "Auto") return ops::HierarchyMode::Auto;
  for (std::string_view on : {"1", "true", "TRUE", "True", "yes", "YES", "on", "ON"}) {
    if (text == on) return ops::HierarchyMode::On;
  }
  for (std::string_view off : {"0", "false", "FALSE", "False", "no", "NO", "off", "OFF"}) {
    if (text == off) return ops::HierarchyMode::Off;
  }
  return refuse(source, knob.name, "is not auto, 1 (on) or 0 (off)");
}

// TUTTI_AUTOTUNE and its settings. The settings without AUTOTUNE=1, and the Gaussian process's
// noise (Tutti's tuner fits none: Note [Autotune search] in src/core/tuning/autotune_search.h), are
// refused rather than ignored.
Status parse_autotune(const detail::KnobSource& source, Config* c) {
  TUTTI_ASSIGN_OR_RETURN(c->autotune, detail::knob_value(detail::knob::AUTOTUNE, source));
  if (source.find(detail::knob::AUTOTUNE_GAUSSIAN_PROCESS_NOISE.name)) {
    return refuse(source, detail::knob::AUTOTUNE_GAUSSIAN_PROCESS_NOISE.name,
                  "is not used: Tutti's autotuner compares median throughputs of measured "
                  "thresholds and fits no Gaussian process (README, Autotune); unset it");
  }
  for (std::string_view knob :
       {detail::knob::AUTOTUNE_LOG.name, detail::knob::AUTOTUNE_WARMUP_SAMPLES.name,
        detail::knob::AUTOTUNE_STEPS_PER_SAMPLE.name,
        detail::knob::AUTOTUNE_BAYES_OPT_MAX_SAMPLES.name}) {
    if (!c->autotune && source.find(knob)) return refuse(source, knob, "needs TUTTI_AUTOTUNE=1");
  }
  c->autotune_log = detail::knob_value(detail::knob::AUTOTUNE_LOG, source);
  TUTTI_ASSIGN_OR_RETURN(std::int64_t warmup,
                         detail::knob_value(detail::knob::AUTOTUNE_WARMUP_SAMPLES, source));
  TUTTI_ASSIGN_OR_RETURN(std::int64_t steps,
                         detail::knob_value(detail::knob::AUTOTUNE_STEPS_PER_SAMPLE, source));
  TUTTI_ASSIGN_OR_RETURN(std::int64_t samples,
                         detail::knob_value(detail::knob::AUTOTUNE_BAYES_OPT_MAX_SAMPLES, source));
  c->autotune_warmup_samples = static_cast<int>(warmup);  // The knobs' ranges fit an int.
  c->autotune_steps_per_sample = static_cast<int>(steps);
  c->autotune_max_samples = static_cast<int>(samples);
  return Status();
}

// TUTTI_TIMELINE and its cycle marks, which mark nothing without a timeline: refused then
// rather than ignored.
Status parse_timeline(const detail::KnobSource& source, Config* c) {
  c->timeline_path = detail::knob_value(detail::knob::TIMELINE, source);
  TUTTI_ASSIGN_OR_RETURN(c->timeline_mark_cycles,
                         detail::knob_value(detail::knob::TIMELINE_MARK_CYCLES, source));
  if (c->timeline_mark_cycles && c->timeline_path.empty()) {
    return refuse(source, detail::knob::TIMELINE_MARK_CYCLES.name,
                  "needs TUTTI_TIMELINE (the timeline file the marks go to)");
  }
  return Status();
}

// The stall inspector's limits. With the inspector off (STALL_CHECK_DISABLE=1) a limit set
// beside it would be ignored, a stalled job then waiting forever: refused instead.
Status parse_stall_check(const detail::KnobSource& source, Config* c) {
  TUTTI_ASSIGN_OR_RETURN(c->stall_check_disabled,
                         detail::knob_value(detail::knob::STALL_CHECK_DISABLE, source));
  if (c->stall_check_disabled) {
    for (std::string_view knob : {detail::knob::STALL_CHECK_TIME_SECONDS.name,
                                  detail::knob::STALL_SHUTDOWN_TIME_SECONDS.name}) {
      if (source.find(knob)) {
        return refuse(source, knob,
                      "is a limit of the stall inspector, which TUTTI_STALL_CHECK_DISABLE=1 "
                      "turns off: unset one of them");
      }
    }
  }
  TUTTI_ASSIGN_OR_RETURN(double check_s,
                         detail::knob_value(detail::knob::STALL_CHECK_TIME_SECONDS, source));
  c->stall_check_time = Config::seconds_to_ms(check_s);
  TUTTI_ASSIGN_OR_RETURN(double shutdown_s,
                         detail::knob_value(detail::knob::STALL_SHUTDOWN_TIME_SECONDS, source));
  c->stall_shutdown_time = Config::seconds_to_ms(shutdown_s);
  return Status();
}

// GPU streams exist only where a device does: without CUDA (and without the simulated device
// the tests install, which has streams) the knob would change nothing.
Result<int> parse_device_streams(const detail::KnobSource& source) {
  TUTTI_ASSIGN_OR_RETURN(std::int64_t streams,
                         detail::knob_value(detail::knob::NUM_NCCL_STREAMS, source));
  if (source.find(detail::knob::NUM_NCCL_STREAMS.name) && !ops::built_with_cuda() &&
      ops::device_ops().device_count() == 0) {
    return refuse(source, detail::knob::NUM_NCCL_STREAMS.name,
                  "sets GPU streams, but this build has no CUDA (meson -Dcuda=enabled): unset it");
  }
  return static_cast<int>(streams);
}

// The elastic layer reads its knobs when an elastic::State is made; they are checked here as
// well, so that a bad value fails init() as every knob's does (README, Configuration).
Status check_elastic(const detail::KnobSource& source) {
  TUTTI_ASSIGN_OR_RETURN(std::int64_t keep, detail::knob_value(detail::knob::ELASTIC_KEEP, source));
  static_cast<void>(keep);
  if (source.find(detail::knob::ELASTIC_KEEP.name) &&
      !source.find(detail::knob::ELASTIC_DIR.name)) {
    return refuse(source, detail::knob::ELASTIC_KEEP.name,
                  "needs TUTTI_ELASTIC_DIR (the directory whose commits it counts)");
  }
  return Status();
}

// "0,8,16" -> {0, 8, 16}.
Result<std::vector<int>> parse_cpus(const detail::KnobSource& source) {
  const std::string text = detail::knob_value(detail::knob::THREAD_AFFINITY, source);
  std::vector<int> cpus;
  if (text.empty()) return cpus;
  std::string_view rest = text;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    int cpu = -1;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), cpu);
    if (item.empty() || error != std::errc() || end != item.data() + item.size() || cpu < 0) {
      return refuse(source, detail::knob::THREAD_AFFINITY.name,
                    "is not a comma-separated list of CPU numbers (one per local rank)");
    }
    cpus.push_back(cpu);
    if (comma == std::string_view::npos) return cpus;
    rest.remove_prefix(comma + 1);
  }
}

// TUTTI_DEBUG: OFF (the default) or DETAIL, which needs the response cache off: a cache hit
// travels as an id, outside the order of the rank's full requests that the check compares.
Status parse_debug(const detail::KnobSource& source, Config* c) {
  const std::string text = detail::knob_value(detail::knob::DEBUG, source);
  if (text == "OFF" || text == "off") return Status();
  if (text != "DETAIL" && text != "detail") {
    return refuse(source, detail::knob::DEBUG.name, "is not one of OFF, DETAIL");
  }
  const std::optional<detail::EnvSetting> setting = source.find(detail::knob::DEBUG.name);
  const std::string shown = str_cat(setting ? setting->variable : "TUTTI_DEBUG", "=", text);
  if (source.find(detail::knob::CACHE_CAPACITY.name) && c->cache_capacity != 0) {
    return refuse(source, detail::knob::CACHE_CAPACITY.name,
                  str_cat("cannot be used with ", shown,
                          ", whose desync check turns the response cache off; unset it"));
  }
  c->desync_check = true;
  c->desync_setting = shown;
  c->cache_capacity = 0;
  return Status();
}

Result<Config::GradientGrouping> parse_gradient_grouping(const detail::KnobSource& source) {
  const std::string text = detail::knob_value(detail::knob::GRADIENT_GROUPING, source);
  if (text == "auto") return Config::GradientGrouping::Auto;
  if (text == "each") return Config::GradientGrouping::Each;
  if (text == "one") return Config::GradientGrouping::One;
  return refuse(source, detail::knob::GRADIENT_GROUPING.name, "is not one of auto, each, one");
}

// TUTTI_HOST_TRANSPORT into c->host_transport and c->host_routes. "small/large" names the
// transport of each size class, as the autotune log's host_transport column does.
Status parse_host_transport(const detail::KnobSource& source, Config* c) {
  const std::string text = detail::knob_value(detail::knob::HOST_TRANSPORT, source);
  c->host_routes = 0;
  if (text == "auto") {
    c->host_transport = ops::HostTransport::Auto;
  } else if (text == "shm" || text == "shm/shm") {
    c->host_transport = ops::HostTransport::Shm;
  } else if (text == "mpi" || text == "mpi/mpi") {
    c->host_transport = ops::HostTransport::Mpi;
  } else if (text == "shm/mpi" || text == "mpi/shm") {
    c->host_transport = ops::HostTransport::Shm;
    c->host_routes = text == "shm/mpi" ? 2 : 1;  // Bit 1: large ones over MPI; bit 0: small.
  } else {
    return refuse(source, detail::knob::HOST_TRANSPORT.name,
                  "is not one of auto, shm, mpi, shm/mpi, mpi/shm");
  }
  return Status();
}

}  // namespace

Result<Config> Config::from_env(const detail::KnobSource& source) {
  Config c;
  TUTTI_ASSIGN_OR_RETURN(c.fusion_threshold_bytes,
                         detail::knob_value(detail::knob::FUSION_THRESHOLD, source));
  c.fusion_threshold_set = source.find(detail::knob::FUSION_THRESHOLD.name).has_value();
  TUTTI_ASSIGN_OR_RETURN(double cycle_ms, detail::knob_value(detail::knob::CYCLE_TIME, source));
  c.cycle_time = ms_to_us(cycle_ms);
  c.cycle_time_set = source.find(detail::knob::CYCLE_TIME.name).has_value();
  TUTTI_ASSIGN_OR_RETURN(c.cache_capacity,
                         detail::knob_value(detail::knob::CACHE_CAPACITY, source));
  c.cache_capacity_set = source.find(detail::knob::CACHE_CAPACITY.name).has_value();
  TUTTI_ASSIGN_OR_RETURN(c.host_memory_cache,
                         detail::knob_value(detail::knob::HOST_MEMORY_CACHE, source));
  TUTTI_RETURN_IF_ERROR(parse_host_transport(source, &c));
  TUTTI_ASSIGN_OR_RETURN(ops::HierarchyMode stores,
                         hierarchy_mode(source, detail::knob::SHM_STREAMING_STORES));
  c.shm_stores = stores == ops::HierarchyMode::Auto ? ops::ShmStores::Auto
                 : stores == ops::HierarchyMode::On ? ops::ShmStores::Streaming
                                                    : ops::ShmStores::Cached;
  TUTTI_RETURN_IF_ERROR(parse_timeline(source, &c));
  TUTTI_RETURN_IF_ERROR(parse_stall_check(source, &c));
  TUTTI_ASSIGN_OR_RETURN(c.hierarchy.allreduce,
                         hierarchy_mode(source, detail::knob::HIERARCHICAL_ALLREDUCE));
  TUTTI_ASSIGN_OR_RETURN(c.hierarchy.allgather,
                         hierarchy_mode(source, detail::knob::HIERARCHICAL_ALLGATHER));
  TUTTI_ASSIGN_OR_RETURN(c.num_nccl_streams, parse_device_streams(source));
  TUTTI_RETURN_IF_ERROR(check_elastic(source));
  TUTTI_ASSIGN_OR_RETURN(c.thread_affinity, parse_cpus(source));
  TUTTI_ASSIGN_OR_RETURN(double start_s, detail::knob_value(detail::knob::START_TIMEOUT, source));
  c.start_timeout = seconds_to_ms(start_s);
  TUTTI_ASSIGN_OR_RETURN(double grace_s,
                         detail::knob_value(detail::knob::EXIT_GRACE_SECONDS, source));
  c.exit_grace = seconds_to_ms(grace_s);
  TUTTI_ASSIGN_OR_RETURN(c.flight_recorder_size,
                         detail::knob_value(detail::knob::FLIGHT_RECORDER_SIZE, source));
  c.flight_recorder_dir = detail::knob_value(detail::knob::FLIGHT_RECORDER_DIR, source);
  TUTTI_RETURN_IF_ERROR(parse_autotune(source, &c));
  TUTTI_RETURN_IF_ERROR(parse_debug(source, &c));
  TUTTI_ASSIGN_OR_RETURN(c.gradient_grouping, parse_gradient_grouping(source));

  if (!detail::parse_log_level(detail::knob_value(detail::knob::LOG_LEVEL, source), &c.log_level)) {
    return refuse(source, detail::knob::LOG_LEVEL.name,
                  "is not one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL");
  }
  TUTTI_ASSIGN_OR_RETURN(c.log_hide_time, detail::knob_value(detail::knob::LOG_HIDE_TIME, source));
  return c;
}

void Config::apply_logging() const {
  detail::set_log_level(log_level);
  detail::set_log_hide_time(log_hide_time);
}

}  // namespace tutti::core
