// SPDX-License-Identifier: Apache-2.0
// The elastic layer's knobs and log lines: see settings.h.
#include "src/elastic/settings.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "src/base/strings.h"
#include "src/common/throw.h"
#include "src/elastic/commit_store.h"
#include "tutti/runtime.h"

namespace tutti::elastic::internal {
namespace {

using detail::str_cat;

// The rows of the knob table, read from the one declaration (the runtime's parser includes
// the same file).
struct KnobRow {
  std::string_view name;
  std::string_view default_value;
  double min;
  double max;
};
#define TUTTI_KNOB(name, type, default_value, min, max, scope, doc) \
  KnobRow{#name, default_value, min, max},
constexpr KnobRow kKnobRows[] = {
#include "src/common/knobs.def"
};
#undef TUTTI_KNOB

const KnobRow& row(std::string_view name) {
  for (const KnobRow& r : kKnobRows) {
    if (r.name == name) return r;
  }
  detail::throw_invalid_argument("elastic: no knob ", name, " in knobs.def");  // A bug.
}

struct Setting {
  std::string variable;
  std::string value;
};

// TUTTI_<name>, else HOROVOD_<name>, as src/common/env.cc's find_setting().
std::optional<Setting> find(std::string_view name) {
  for (std::string_view prefix : {"TUTTI_", "HOROVOD_"}) {
    std::string variable = str_cat(prefix, name);
    if (const char* value = std::getenv(variable.c_str())) return Setting{variable, value};
  }
  return std::nullopt;
}

int int_knob(std::string_view name) {
  const KnobRow& knob = row(name);
  const std::optional<Setting> setting = find(name);
  const std::string variable = setting ? setting->variable : str_cat("TUTTI_", name);
  const std::string text = setting ? setting->value : std::string(knob.default_value);
  const auto range = [&] {
    return str_cat("an integer in [", static_cast<std::int64_t>(knob.min), ", ",
                   static_cast<std::int64_t>(knob.max), "]");
  };
  // As init() reads it (src/common/env.cc's parse_integral): an integer, or a decimal with an
  // exponent that is one exactly ("1e3").
  const char* const last = text.data() + text.size();
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), last, value);
  if (text.empty() || error != std::errc() || end != last) {
    double x = 0;
    const auto [x_end, x_error] = std::from_chars(text.data(), last, x);
    const bool integral = !text.empty() && text[0] != '+' && x_error == std::errc() &&
                          x_end == last && std::trunc(x) == x && std::fabs(x) <= 9007199254740992.0;
    if (!integral) {
      detail::throw_invalid_argument(variable, "='", text, "' is not an integer: must be ",
                                     range());
    }
    value = static_cast<std::int64_t>(x);
  }
  if (static_cast<double>(value) < knob.min || static_cast<double>(value) > knob.max) {
    detail::throw_invalid_argument(variable, "='", text, "' is out of range: must be ", range());
  }
  return static_cast<int>(value);
}

// The position of TUTTI_LOG_LEVEL's value among TRACE ... FATAL (WARNING, 3, by default).
int log_threshold() {
  static const int threshold = [] {
    constexpr std::array<std::string_view, 6> kLevels = {"TRACE",   "DEBUG", "INFO",
                                                         "WARNING", "ERROR", "FATAL"};
    const std::optional<Setting> setting = find("LOG_LEVEL");
    std::string text = setting ? setting->value : "WARNING";
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    const auto* it = std::find(kLevels.begin(), kLevels.end(), text);
    return it == kLevels.end() ? 3 : static_cast<int>(it - kLevels.begin());
  }();
  return threshold;
}

}  // namespace

Settings read_settings() {
  Settings s;
  if (std::optional<Setting> dir = find("ELASTIC_DIR")) s.directory = expand_directory(dir->value);
  s.keep = int_knob("ELASTIC_KEEP");
  return s;
}

void log_line(Level level, const std::string& message) {
  if (log_threshold() > (level == Level::Info ? 2 : 3)) return;
  std::string line = "[tutti";
  if (is_initialized()) line += str_cat(" rank ", rank());
  line += str_cat("] ", level == Level::Info ? "INFO" : "WARNING", ": elastic: ", message, "\n");
  // Best effort: a log line that cannot be written is not worth failing training for.
  static_cast<void>(::write(STDERR_FILENO, line.data(), line.size()));
}

}  // namespace tutti::elastic::internal
