// SPDX-License-Identifier: Apache-2.0
// String building without std::format (GCC 12 lacks it).
#pragma once

#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace tutti::detail {

// Concatenates the arguments as an ostream would print them.
template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
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

}  // namespace tutti::detail
