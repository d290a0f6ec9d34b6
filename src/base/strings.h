// SPDX-License-Identifier: Apache-2.0
// String building without std::format (GCC 12 lacks it).
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace tutti::detail {

// One argument of str_cat(), as an ostream prints it. Strings and integers are appended
// directly: through an ostringstream (its locale, its buffer) a point-to-point op's name took
// 227 ns, appended 20 ns (2-core AMD EPYC VM), and the stream was a sixth of the op's own
// time (issue 26, P6). Character types print as characters and bool as 1 or 0, as on an
// ostream; anything else (floating point, enums, types with their own operator<<) goes
// through one.
template <class T>
void append_printed(std::string& out, const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    out += value ? '1' : '0';
  } else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, signed char> ||
                       std::is_same_v<T, unsigned char>) {
    out += static_cast<char>(value);
  } else if constexpr (std::is_integral_v<T>) {
    char digits[24];  // A 64-bit integer's 20 digits and its sign.
    const std::to_chars_result end = std::to_chars(digits, digits + sizeof digits, value);
    out.append(digits, end.ptr);
  } else if constexpr (std::is_same_v<T, const char*> || std::is_same_v<T, char*>) {
    if (value != nullptr) out += value;  // An ostream prints nothing for null (and fails).
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out += std::string_view(value);
  } else {
    std::ostringstream printed;
    printed << value;
    out += printed.str();
  }
}

// Concatenates the arguments as an ostream would print them.
template <class... Args>
std::string str_cat(const Args&... args) {
  std::string out;
  (append_printed(out, args), ...);
  return out;
}

// "[17, 3]"
inline std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// "0, 2, 3"
template <class T>
std::string join_list(const std::vector<T>& values, std::string_view separator = ", ") {
  std::ostringstream out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out << separator;
    out << values[i];
  }
  return out.str();
}

// FNV-1a (64-bit) over `size` bytes at `bytes`, continuing from `hash` (kFnv1aBasis to start):
// the same on every rank and build, unlike std::hash, for the signatures ranks compare to agree
// on a model's or an optimizer's parameters (names, shapes).
inline constexpr std::uint64_t kFnv1aBasis = 0xcbf29ce484222325ULL;
inline std::uint64_t fnv1a(std::uint64_t hash, const void* bytes, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= static_cast<const unsigned char*>(bytes)[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace tutti::detail
