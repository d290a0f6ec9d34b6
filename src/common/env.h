// SPDX-License-Identifier: Apache-2.0
// The configuration table: every TUTTI_<NAME> knob (fallback HOROVOD_<NAME>) with its type,
// default and meaning, declared once in env.cc, and typed readers that name the variable when
// a value does not parse.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "src/common/status.h"

namespace tutti::detail {

enum class KnobType { Int, Double, Bool, String };

struct Knob {
  std::string_view name;           // Without prefix: "FUSION_THRESHOLD".
  KnobType type;
  std::string_view default_value;  // As text, for documentation and --help output.
  std::string_view doc;            // One line.
};

// Every knob Tutti reads, in documentation order.
std::span<const Knob> knobs();

struct EnvSetting {
  std::string variable;  // The variable that supplied the value, e.g. "HOROVOD_CYCLE_TIME".
  std::string value;
};

// TUTTI_<knob> if set, else HOROVOD_<knob>, else nothing. If both are set and differ, TUTTI_
// wins and a warning is logged.
std::optional<EnvSetting> find_setting(std::string_view knob);

// Typed readers: the default when unset, InvalidArgument naming the variable when malformed,
// e.g. "TUTTI_CYCLE_TIME='12x' is not a number".
Result<std::int64_t> int_setting(std::string_view knob, std::int64_t default_value);
Result<double> double_setting(std::string_view knob, double default_value);
Result<bool> bool_setting(std::string_view knob, bool default_value);
std::string string_setting(std::string_view knob, std::string_view default_value);

// Logs one warning per TUTTI_* variable in the environment that is not a knob.
void warn_unknown_settings();

}  // namespace tutti::detail
