// SPDX-License-Identifier: Apache-2.0
#include "src/common/env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "src/common/logging.h"
#include "src/common/strings.h"

extern char** environ;  // NOLINT(readability-identifier-naming): POSIX's name.

namespace tutti::detail {
namespace {

// The one table of knobs, mirrored in DESIGN.md section 4 and the README.
constexpr Knob kKnobs[] = {
    {"FUSION_THRESHOLD", KnobType::Int, "1048576",
     "max bytes fused into one collective; 0 disables fusion"},
    {"CYCLE_TIME", KnobType::Double, "1", "ms a ready tensor may wait for others to fuse with"},
    {"CACHE_CAPACITY", KnobType::Int, "1024", "response-cache entries per process set; 0 disables"},
    {"TIMELINE", KnobType::String, "", "Chrome-trace timeline file written by rank 0"},
    {"TIMELINE_MARK_CYCLES", KnobType::Bool, "0", "mark negotiation cycles in the timeline"},
    {"STALL_CHECK_DISABLE", KnobType::Bool, "0", "disable the stall inspector"},
    {"STALL_CHECK_TIME_SECONDS", KnobType::Double, "60", "warn about ranks missing an op after"},
    {"STALL_SHUTDOWN_TIME_SECONDS", KnobType::Double, "600",
     "fail stalled ops with Stalled after; 0 = never"},
    {"AUTOTUNE", KnobType::Bool, "0", "tune fusion threshold and cycle time online"},
    {"AUTOTUNE_LOG", KnobType::String, "", "CSV log of autotuning"},
    {"HIERARCHICAL_ALLREDUCE", KnobType::Bool, "0", "intra-node then inter-node allreduce"},
    {"HIERARCHICAL_ALLGATHER", KnobType::Bool, "0", "intra-node then inter-node allgather"},
    {"NUM_NCCL_STREAMS", KnobType::Int, "1", "GPU streams used round-robin"},
    {"LOG_LEVEL", KnobType::String, "WARNING", "TRACE, DEBUG, INFO, WARNING, ERROR or FATAL"},
    {"LOG_HIDE_TIME", KnobType::Bool, "0", "omit the time from log lines"},
    {"THREAD_AFFINITY", KnobType::String, "", "comma-separated core per local rank for the "
                                              "background thread"},
    // Set by tuttirun for horovodrun compatibility; read by nothing yet (documented so).
    {"START_TIMEOUT", KnobType::Double, "30", "seconds for all ranks to start (launcher)"},
    {"AUTOTUNE_WARMUP_SAMPLES", KnobType::Int, "3", "autotune: samples discarded at start"},
    {"AUTOTUNE_STEPS_PER_SAMPLE", KnobType::Int, "10", "autotune: steps per sample"},
    {"AUTOTUNE_BAYES_OPT_MAX_SAMPLES", KnobType::Int, "20", "autotune: max samples"},
    {"AUTOTUNE_GAUSSIAN_PROCESS_NOISE", KnobType::Double, "0.8", "autotune: GP noise"},
    {"BUILD_DIR", KnobType::String, "", "tuttirun --check-build: where to find tutti_config.h"},
};

const char* get(const std::string& variable) { return std::getenv(variable.c_str()); }

}  // namespace

std::span<const Knob> knobs() { return kKnobs; }

std::optional<EnvSetting> find_setting(std::string_view knob) {
  const std::string tutti_name = str_cat("TUTTI_", knob);
  const std::string horovod_name = str_cat("HOROVOD_", knob);
  const char* tutti_value = get(tutti_name);
  const char* horovod_value = get(horovod_name);
  if (tutti_value) {
    // TUTTI_ first: a job script may keep HOROVOD_ values around while moving on.
    if (horovod_value && std::strcmp(tutti_value, horovod_value) != 0) {
      TUTTI_LOG_WARNING(tutti_name, "='", tutti_value, "' overrides ", horovod_name, "='",
                        horovod_value, "'");
    }
    return EnvSetting{.variable = tutti_name, .value = tutti_value};
  }
  if (horovod_value) return EnvSetting{.variable = horovod_name, .value = horovod_value};
  return std::nullopt;
}

Result<std::int64_t> int_setting(std::string_view knob, std::int64_t default_value) {
  const std::optional<EnvSetting> setting = find_setting(knob);
  if (!setting) return default_value;
  const char* text = setting->value.c_str();
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE) {
    return invalid_argument(str_cat(setting->variable, "='", setting->value, "' is not an integer"));
  }
  return static_cast<std::int64_t>(value);
}

Result<double> double_setting(std::string_view knob, double default_value) {
  const std::optional<EnvSetting> setting = find_setting(knob);
  if (!setting) return default_value;
  const char* text = setting->value.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || errno == ERANGE) {
    return invalid_argument(str_cat(setting->variable, "='", setting->value, "' is not a number"));
  }
  return value;
}

Result<bool> bool_setting(std::string_view knob, bool default_value) {
  const std::optional<EnvSetting> setting = find_setting(knob);
  if (!setting) return default_value;
  const std::string& v = setting->value;
  for (const char* yes : {"1", "true", "TRUE", "True", "yes", "YES", "on", "ON"}) {
    if (v == yes) return true;
  }
  for (const char* no : {"0", "false", "FALSE", "False", "no", "NO", "off", "OFF", ""}) {
    if (v == no) return false;
  }
  return invalid_argument(
      str_cat(setting->variable, "='", v, "' is not a boolean (use 1/0, true/false, yes/no)"));
}

std::string string_setting(std::string_view knob, std::string_view default_value) {
  const std::optional<EnvSetting> setting = find_setting(knob);
  return setting ? setting->value : std::string(default_value);
}

void warn_unknown_settings() {
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string_view assignment(*entry);
    if (!assignment.starts_with("TUTTI_")) continue;
    const std::string_view name = assignment.substr(6, assignment.find('=') - 6);
    bool known = false;
    for (const Knob& knob : kKnobs) known = known || knob.name == name;
    if (!known) TUTTI_LOG_WARNING("unknown setting TUTTI_", name, " is ignored");
  }
}

}  // namespace tutti::detail
