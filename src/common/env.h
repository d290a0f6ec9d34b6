// SPDX-License-Identifier: Apache-2.0
// The configuration table: every TUTTI_<NAME> knob (fallback HOROVOD_<NAME>) with its type,
// default, range, scope and meaning, declared once in knobs.def, and typed readers that name
// the variable when a value does not parse or is out of range.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "src/common/status.h"

namespace tutti::detail {

enum class KnobType { Int, Double, Bool, String };
// See knobs.def.
enum class KnobScope { Job, Rank, Launcher };

struct Knob {
  std::string_view name;  // Without prefix: "FUSION_THRESHOLD".
  KnobType type;
  std::string_view default_value;  // As text, parsed like a value from the environment.
  double min;                      // Inclusive range of numeric values.
  double max;
  KnobScope scope;
  std::string_view doc;  // One line.
};

// Every knob, in knobs.def's order.
std::span<const Knob> knobs();
// The knob called `name`; a TUTTI_CHECK failure (a bug) if there is none.
const Knob& knob(std::string_view name);

struct EnvSetting {
  std::string variable;  // The variable that supplied the value, e.g. "HOROVOD_CYCLE_TIME".
  std::string value;
};

// TUTTI_<knob> if set, else HOROVOD_<knob>, else nothing. If both are set and differ, TUTTI_
// wins and a warning is logged.
std::optional<EnvSetting> find_setting(std::string_view knob);

// Readers of one variable: `default_value` when unset, InvalidArgument naming the variable
// when malformed, e.g. "TUTTI_CYCLE_TIME='12x' is not a number". No range check.
Result<std::int64_t> int_setting(std::string_view knob, std::int64_t default_value);
Result<double> double_setting(std::string_view knob, double default_value);
Result<bool> bool_setting(std::string_view knob, bool default_value);
std::string string_setting(std::string_view knob, std::string_view default_value);

// Where the knobs' values come from: the environment (find_setting), except for knobs given
// a value of their own with set(): rank 0's values of the Job knobs (Note [Agreed settings]
// in src/core/start_handshake.h).
class KnobSource {
 public:
  // The value of `knob` from now on, reported in messages as coming from `variable`.
  void set(std::string_view knob, std::string variable, std::string value);
  // `knob` from now on counts as unset (its default), whatever the environment says.
  void unset(std::string_view knob);
  std::optional<EnvSetting> find(std::string_view knob) const;

 private:
  std::map<std::string, std::optional<EnvSetting>, std::less<>> values_;
};

// Readers of a knob of the table: its value in `source`, or the table's default when unset,
// checked against the knob's type and range ("TUTTI_CYCLE_TIME='inf' is out of range: must be
// a number in [0, 10000]"). Any thread; they read the environment each time.
Result<std::int64_t> int_knob(std::string_view name, const KnobSource& source = {});
Result<double> double_knob(std::string_view name, const KnobSource& source = {});
Result<bool> bool_knob(std::string_view name, const KnobSource& source = {});
std::string string_knob(std::string_view name, const KnobSource& source = {});
// The value `name` has when nothing sets it (the table's default, parsed).
std::int64_t default_int(std::string_view name);
double default_double(std::string_view name);
bool default_bool(std::string_view name);

// Logs one warning per TUTTI_* variable in the environment that is not a knob.
void warn_unknown_settings();

}  // namespace tutti::detail
