// SPDX-License-Identifier: Apache-2.0
// The configuration table: every TUTTI_<NAME> knob (fallback HOROVOD_<NAME>) with its type,
// default, range, scope and meaning, declared once in knobs.def, and one typed reader per knob
// (Note [Typed knobs]) that names the variable when a value does not parse or is out of range.
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
const Knob& knob_named(std::string_view name);

struct EnvSetting {
  std::string variable;  // The variable that supplied the value, e.g. "HOROVOD_CYCLE_TIME".
  std::string value;
};

// TUTTI_<knob> if set, else HOROVOD_<knob>, else nothing. If both are set and differ, TUTTI_
// wins and a warning is logged.
std::optional<EnvSetting> find_setting(std::string_view knob);

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

// Note [Typed knobs]
// Each knob of knobs.def is a constant of namespace `knob`, spelled as its variable and typed by
// the knob's type (NCCL's NCCL_PARAM idea): knob_value(knob::CYCLE_TIME) is a Result<double>,
// and a misspelt knob, or a knob read as the wrong type, does not compile.
template <KnobType kType>
struct KnobId {
  std::string_view name;  // Without prefix: "FUSION_THRESHOLD".
};

namespace knob {
// NOLINTBEGIN(readability-identifier-naming): each constant is spelled as its variable.
#define TUTTI_KNOB(name, type, default_value, min, max, scope, doc) \
  inline constexpr KnobId<KnobType::type> name{#name};
#include "src/common/knobs.def"
#undef TUTTI_KNOB
// NOLINTEND(readability-identifier-naming)
}  // namespace knob

// A knob's value in `source`, or the table's default when unset, checked against the knob's
// type and range ("TUTTI_CYCLE_TIME='inf' is out of range: must be a number in [0, 10000]").
// Any thread; they read the environment each time.
Result<std::int64_t> knob_value(KnobId<KnobType::Int> id, const KnobSource& source = {});
Result<double> knob_value(KnobId<KnobType::Double> id, const KnobSource& source = {});
Result<bool> knob_value(KnobId<KnobType::Bool> id, const KnobSource& source = {});
std::string knob_value(KnobId<KnobType::String> id, const KnobSource& source = {});
// The value a knob has when nothing sets it (the table's default, parsed).
std::int64_t knob_default(KnobId<KnobType::Int> id);
double knob_default(KnobId<KnobType::Double> id);
bool knob_default(KnobId<KnobType::Bool> id);

// Whether two settings give `knob` the same value; nullopt is unset, which is the default. Numbers
// compare as numbers ("01000" and "1000", "0.5" and ".5"), booleans as booleans ("1" and "yes"),
// anything else (strings, or a value that does not parse) as text.
bool same_knob_value(const Knob& knob, const std::optional<std::string>& a,
                     const std::optional<std::string>& b);

// Logs one warning per TUTTI_* variable in the environment that is not a knob.
void warn_unknown_settings();

}  // namespace tutti::detail
