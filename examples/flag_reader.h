// SPDX-License-Identifier: Apache-2.0
// Strict reading of an example's command line ("--flag value" pairs, switches and --help): an
// unknown flag, a flag without its value, or a value that is not wholly a number in range is a
// fault that ends the program with exit 2 and a message naming the flag and the value, never
// ignored or read as something else (atoi, stoul and strtol read "8x" as 8, "abc" as 0 and "-1"
// as a huge unsigned). Header-only; needs no MPI, so a program can read its flags before init.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace tutti::examples {

// The whole number `text` spells and nothing else (no blanks, '+', hex or exponent), if it lies
// in [min, max].
inline std::optional<std::int64_t> parse_integer(std::string_view text, std::int64_t min,
                                                 std::int64_t max) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (value < min || value > max) return std::nullopt;
  return value;
}

// The finite number `text` spells and nothing else, if it lies in [min, max].
inline std::optional<double> parse_real(std::string_view text, double min, double max) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (!std::isfinite(value) || value < min || value > max) return std::nullopt;
  return value;
}

// Reads argv flag by flag. The program names each flag next() stops at and takes its value
// with integer(), real() or text() (a switch takes none); anything else is unknown(). The first
// fault ends the reading; exit_status() then says how the program ends:
//   FlagReader flags("ring_allreduce", argc, argv);
//   while (flags.next()) {
//     if (flags.is("--elements")) elements = flags.integer(1, kMaxElements);
//     else flags.unknown();
//   }
//   if (const std::optional<int> status = flags.exit_status(kUsage)) return *status;
// Local; not thread-safe.
class FlagReader {
 public:
  // `program` prefixes the messages. argv must outlive the reader.
  FlagReader(const char* program, int argc, char** argv)
      : program_(program), args_(argv + 1, argv + (argc > 0 ? argc : 1)) {}

  // Moves to the next flag: false at the end, at --help or after a fault.
  bool next() {
    if (!fault_.empty() || help_ || next_ == args_.size()) return false;
    flag_ = args_[next_++];
    help_ = flag_ == "--help";
    if (!help_) given_.push_back(flag_);
    return !help_;
  }
  bool is(std::string_view flag) const { return flag_ == flag; }
  // Whether the command line has `flag` (among those read so far).
  bool given(std::string_view flag) const {
    for (const std::string& g : given_)
      if (g == flag) return true;
    return false;
  }

  // The current flag's value: a whole number in [min, max], or (a fault) `min`.
  std::int64_t integer(std::int64_t min, std::int64_t max) {
    const std::optional<std::string> v = value();
    const std::optional<std::int64_t> x = v ? parse_integer(*v, min, max) : std::nullopt;
    if (v && !x) {
      bad_value(*v, "a whole number from " + std::to_string(min) + " to " + std::to_string(max));
    }
    return x.value_or(min);
  }
  // The current flag's value: a finite number in [min, max], or (a fault) `min`.
  double real(double min, double max) {
    const std::optional<std::string> v = value();
    const std::optional<double> x = v ? parse_real(*v, min, max) : std::nullopt;
    if (v && !x) bad_value(*v, "a number from " + shortest(min) + " to " + shortest(max));
    return x.value_or(min);
  }
  // The current flag's value: a finite number above 0, or (a fault) 1.
  double positive_real() {
    const std::optional<std::string> v = value();
    const std::optional<double> x = v ? parse_real(*v, 0, HUGE_VAL) : std::nullopt;
    if (v && (!x || *x == 0)) bad_value(*v, "a finite number above 0");
    return x && *x > 0 ? *x : 1;
  }
  // The current flag's value as it is (empty after a fault).
  std::string text() { return value().value_or(""); }
  // The current flag's value: one of `choices`, or (a fault) the first.
  std::string choice(std::initializer_list<std::string_view> choices) {
    const std::optional<std::string> v = value();
    std::string wanted;
    for (std::string_view c : choices) {
      if (v == c) return *v;
      wanted += (wanted.empty() ? "" : "|") + std::string(c);
    }
    if (v) bad_value(*v, wanted);
    return std::string(*choices.begin());
  }

  void unknown() {
    fail(flag_.starts_with("-") ? "unknown flag " + flag_ : "unexpected argument '" + flag_ + "'");
  }
  // A fault the program found itself (a combination of flags it would not run as asked); an
  // empty message is none.
  void fail(std::string message) {
    if (fault_.empty() && !help_) fault_ = std::move(message);
  }

  // After the reading: nullopt to run the program; 0 after --help (the usage printed on
  // stdout); 2 after a fault (the fault and the usage printed on stderr). `print`: whether this
  // process prints them (rank 0 only, where the flags are read after init).
  std::optional<int> exit_status(const char* usage, bool print = true) const {
    if (help_) {
      if (print) std::fputs(usage, stdout);
      return 0;
    }
    if (fault_.empty()) return std::nullopt;
    if (print) std::fprintf(stderr, "%s: %s\n%s", program_, fault_.c_str(), usage);
    return 2;
  }

 private:
  // The current flag's value, taken from argv; nullopt (a fault) if there is none.
  std::optional<std::string> value() {
    if (!fault_.empty()) return std::nullopt;
    if (next_ == args_.size()) {
      fail(flag_ + " needs a value");
      return std::nullopt;
    }
    return args_[next_++];
  }
  void bad_value(const std::string& value, const std::string& wanted) {
    fail("bad " + flag_ + " '" + value + "': want " + wanted);
  }
  static std::string shortest(double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", x);
    return text;
  }

  const char* program_;
  std::vector<std::string> args_;  // argv without the program.
  std::size_t next_ = 0;           // The argument after the current flag.
  std::string flag_;
  std::vector<std::string> given_;
  std::string fault_;  // The first fault; empty if none.
  bool help_ = false;
};

}  // namespace tutti::examples
