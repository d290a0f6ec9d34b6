// SPDX-License-Identifier: Apache-2.0
#include "src/common/env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "src/base/strings.h"
#include "src/common/check.h"
#include "src/common/logging.h"

extern char** environ;  // NOLINT(readability-identifier-naming): POSIX's name.

namespace tutti::detail {
namespace {

constexpr Knob kKnobs[] = {
#define TUTTI_KNOB(name, type, default_value, min, max, scope, doc) \
  {#name, KnobType::type, default_value, min, max, KnobScope::scope, doc},
#include "src/common/knobs.def"
#undef TUTTI_KNOB
};

const char* get(const std::string& variable) { return std::getenv(variable.c_str()); }

// Whether `text` starts as a plain decimal number does: a digit, '-' or '.'. strtoll() and
// strtod() also skip leading spaces and take '+', and strtod() "inf", "nan" and hexadecimal
// ("0x10"); trailing spaces are refused, and the elastic layer's from_chars() takes none of
// them, so these forms are refused alike everywhere, as not numbers.
bool plain_start(const std::string& text) {
  if (text.empty()) return false;
  const char c = text[0];
  return (c >= '0' && c <= '9') || c == '-' || c == '.';
}

// Text to a number, or nullopt if it is not one entirely. Out-of-range (ERANGE) counts as not
// a number for integers; doubles keep an overflow's inf, which the range check then refuses by
// name, and refuse what underflows (1e-400 would read as 0).
std::optional<std::int64_t> parse_int(const std::string& text) {
  if (!plain_start(text)) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return static_cast<std::int64_t>(value);
}

std::optional<double> parse_double(const std::string& text) {
  if (!plain_start(text) || text.find_first_of("xX") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  if (errno == ERANGE && std::fabs(value) < 1) return std::nullopt;  // Underflow.
  return value;
}

// An integer knob's value: an integer, or a decimal with an exponent that is one exactly
// ("1e6"; not "1.5", nor beyond 2^53, where a double no longer holds every integer).
std::optional<std::int64_t> parse_integral(const std::string& text) {
  if (std::optional<std::int64_t> value = parse_int(text)) return value;
  const std::optional<double> x = parse_double(text);
  if (!x || std::trunc(*x) != *x || !(std::fabs(*x) <= 9007199254740992.0)) return std::nullopt;
  return static_cast<std::int64_t>(*x);
}

std::optional<bool> parse_bool(std::string_view v) {
  for (const char* yes : {"1", "true", "TRUE", "True", "yes", "YES", "on", "ON"}) {
    if (v == yes) return true;
  }
  for (const char* no : {"0", "false", "FALSE", "False", "no", "NO", "off", "OFF"}) {
    if (v == no) return false;
  }
  return std::nullopt;
}

// "1099511627776", "0.001": integers exactly, others as the shortest usual decimal.
std::string number_text(double x) {
  if (std::trunc(x) == x && std::fabs(x) < 9007199254740992.0) {
    return std::to_string(static_cast<std::int64_t>(x));
  }
  return str_cat(x);
}

// "an integer", or "a number": what a value of the knob is.
const char* kind_of(const Knob& k) { return k.type == KnobType::Int ? "an integer" : "a number"; }

// "must be an integer in [0, 10]": the end of every refusal of a number, malformed or out of
// range (the README promises the range in both).
std::string valid_range(const Knob& k) {
  return str_cat("must be ", kind_of(k), " in [", number_text(k.min), ", ", number_text(k.max),
                 "]");
}

Status out_of_range(const Knob& k, const KnobSource& source) {
  const std::optional<EnvSetting> setting = source.find(k.name);
  TUTTI_CHECK(setting.has_value(), "the default of ", k.name, " is outside its own range");
  return invalid_argument(
      str_cat(setting->variable, "='", setting->value, "' is out of range: ", valid_range(k)));
}

// Whether this pair of values is new to this process: a knob is looked up several times per
// init(), and its override is worth one warning, not one per lookup.
bool first_override(const std::string& variable, const char* value, const char* overridden) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  const std::lock_guard<std::mutex> lock(mutex);
  return warned.insert(str_cat(variable, '\0', value, '\0', overridden)).second;
}

}  // namespace

std::span<const Knob> knobs() { return kKnobs; }

const Knob& knob_named(std::string_view name) {
  for (const Knob& k : kKnobs) {
    if (k.name == name) return k;
  }
  TUTTI_CHECK(false, "no knob named ", name, " in knobs.def");
}

std::optional<EnvSetting> find_setting(std::string_view knob) {
  const std::string tutti_name = str_cat("TUTTI_", knob);
  const std::string horovod_name = str_cat("HOROVOD_", knob);
  const char* tutti_value = get(tutti_name);
  const char* horovod_value = get(horovod_name);
  if (tutti_value) {
    // TUTTI_ first: a job script may keep HOROVOD_ values around while moving on.
    if (horovod_value && std::strcmp(tutti_value, horovod_value) != 0 &&
        first_override(tutti_name, tutti_value, horovod_value)) {
      TUTTI_LOG_WARNING(tutti_name, "='", tutti_value, "' overrides ", horovod_name, "='",
                        horovod_value, "'");
    }
    return EnvSetting{.variable = tutti_name, .value = tutti_value};
  }
  if (horovod_value) return EnvSetting{.variable = horovod_name, .value = horovod_value};
  return std::nullopt;
}

void KnobSource::set(std::string_view knob, std::string variable, std::string value) {
  values_.insert_or_assign(std::string(knob),
                           EnvSetting{.variable = std::move(variable), .value = std::move(value)});
}

void KnobSource::unset(std::string_view knob) {
  values_.insert_or_assign(std::string(knob), std::nullopt);
}

std::optional<EnvSetting> KnobSource::find(std::string_view knob) const {
  if (auto it = values_.find(knob); it != values_.end()) return it->second;
  return find_setting(knob);
}

namespace {

// "... is not an integer: must be an integer in [0, 10]".
Status not_parsed(const Knob& k, const EnvSetting& setting) {
  return invalid_argument(str_cat(setting.variable, "='", setting.value, "' is not ", kind_of(k),
                                  ": ", valid_range(k)));
}

Result<std::int64_t> int_from(const Knob& k, const std::optional<EnvSetting>& setting,
                              std::int64_t fallback) {
  if (!setting) return fallback;
  if (std::optional<std::int64_t> value = parse_integral(setting->value)) return *value;
  return not_parsed(k, *setting);
}

Result<double> double_from(const Knob& k, const std::optional<EnvSetting>& setting,
                           double fallback) {
  if (!setting) return fallback;
  if (std::optional<double> value = parse_double(setting->value)) return *value;
  return not_parsed(k, *setting);
}

Result<bool> bool_from(const std::optional<EnvSetting>& setting, bool fallback) {
  if (!setting) return fallback;
  if (std::optional<bool> value = parse_bool(setting->value)) return *value;
  return invalid_argument(str_cat(setting->variable, "='", setting->value,
                                  "' is not a boolean (use 1/0, true/false, yes/no)"));
}

}  // namespace

namespace {

template <class T>
T parsed_default(const Knob& k, const std::optional<T>& value) {
  TUTTI_CHECK(value.has_value(), "knob ", k.name, "'s default '", k.default_value,
              "' does not parse as its type");
  return *value;
}

}  // namespace

std::int64_t knob_default(KnobId<KnobType::Int> id) {
  const Knob& k = knob_named(id.name);
  return parsed_default(k, parse_int(std::string(k.default_value)));
}

double knob_default(KnobId<KnobType::Double> id) {
  const Knob& k = knob_named(id.name);
  return parsed_default(k, parse_double(std::string(k.default_value)));
}

bool knob_default(KnobId<KnobType::Bool> id) {
  const Knob& k = knob_named(id.name);
  return parsed_default(k, parse_bool(k.default_value));
}

Result<std::int64_t> knob_value(KnobId<KnobType::Int> id, const KnobSource& source) {
  const Knob& k = knob_named(id.name);
  TUTTI_ASSIGN_OR_RETURN(std::int64_t value, int_from(k, source.find(id.name), knob_default(id)));
  // Compared as doubles: the table's bounds are exact in double (at most 2^53).
  if (static_cast<double>(value) < k.min || static_cast<double>(value) > k.max) {
    return out_of_range(k, source);
  }
  return value;
}

Result<double> knob_value(KnobId<KnobType::Double> id, const KnobSource& source) {
  const Knob& k = knob_named(id.name);
  TUTTI_ASSIGN_OR_RETURN(double value, double_from(k, source.find(id.name), knob_default(id)));
  // !(x >= min) also refuses NaN.
  if (!(value >= k.min) || !(value <= k.max)) return out_of_range(k, source);
  return value;
}

Result<bool> knob_value(KnobId<KnobType::Bool> id, const KnobSource& source) {
  return bool_from(source.find(id.name), knob_default(id));
}

std::string knob_value(KnobId<KnobType::String> id, const KnobSource& source) {
  const std::optional<EnvSetting> setting = source.find(id.name);
  return setting ? setting->value : std::string(knob_named(id.name).default_value);
}

bool same_knob_value(const Knob& knob, const std::optional<std::string>& a,
                     const std::optional<std::string>& b) {
  const std::string x = a.value_or(std::string(knob.default_value));
  const std::string y = b.value_or(std::string(knob.default_value));
  if (x == y) return true;
  switch (knob.type) {
    case KnobType::Int: {
      const std::optional<std::int64_t> i = parse_integral(x);
      return i && i == parse_integral(y);
    }
    case KnobType::Double: {
      const std::optional<double> d = parse_double(x);
      return d && d == parse_double(y);
    }
    case KnobType::Bool: {
      const std::optional<bool> v = parse_bool(x);
      return v && v == parse_bool(y);
    }
    case KnobType::String: return false;
  }
  return false;
}

void warn_unknown_settings() {
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string_view assignment(*entry);
    if (!assignment.starts_with("TUTTI_")) continue;
    const std::string_view name = assignment.substr(6, assignment.find('=') - 6);
    bool known = false;
    for (const Knob& k : kKnobs) known = known || k.name == name;
    if (!known) TUTTI_LOG_WARNING("unknown setting TUTTI_", name, " is ignored");
  }
}

}  // namespace tutti::detail
