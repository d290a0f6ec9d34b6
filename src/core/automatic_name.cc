// SPDX-License-Identifier: Apache-2.0
#include "src/core/automatic_name.h"

#include <algorithm>
#include <charconv>
#include <system_error>

namespace tutti::core {
namespace {

constexpr std::string_view kMarker = ".noname.";

// Where `name`'s number starts, if it is an automatic name's; npos otherwise. The digits at the
// end first, then the marker just before them: no search through the name (the coordinator asks
// this of every response it caches, cacheable() in negotiation/coordinator.cc). The marker ends in
// '.', so its last occurrence before the digits is the one right before them.
std::size_t number_start(std::string_view name) {
  std::size_t start = name.size();
  // Not std::isdigit(): a call for the locale's table per character.
  while (start > 0 && name[start - 1] >= '0' && name[start - 1] <= '9') --start;
  if (start == name.size() || start < kMarker.size()) return std::string_view::npos;
  return name.substr(start - kMarker.size(), kMarker.size()) == kMarker ? start
                                                                        : std::string_view::npos;
}

}  // namespace

base::InlineString automatic_name(Collective op, std::uint64_t n) {
  // Made under the submission queue's lock: in a buffer on the stack, then in place (Note
  // [Names in place]; "reducescatter.noname.<n>" fits up to n of ten digits), and lowered by
  // hand, since std::tolower() is a call through the locale for each character.
  const std::string_view upper = to_string(op);
  char name[64];  // The longest op name, 18, the marker, 8, and 2^64 - 1's 20 digits.
  char* end = name;
  for (const char c : upper) *end++ = c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  end = std::copy(kMarker.begin(), kMarker.end(), end);
  end = std::to_chars(end, name + sizeof name, n).ptr;
  return base::InlineString(std::string_view(name, static_cast<std::size_t>(end - name)));
}

std::optional<std::uint64_t> automatic_number(std::string_view name) {
  const std::size_t start = number_start(name);
  if (start == std::string_view::npos) return std::nullopt;
  std::uint64_t n = 0;
  const auto [end, error] = std::from_chars(name.data() + start, name.data() + name.size(), n);
  if (error != std::errc() || end != name.data() + name.size()) return std::nullopt;  // Overflow.
  return n;
}

std::string_view without_automatic_number(std::string_view name) {
  const std::size_t start = number_start(name);
  return start == std::string_view::npos ? name : name.substr(0, start - 1);
}

}  // namespace tutti::core
