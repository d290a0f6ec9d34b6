// SPDX-License-Identifier: Apache-2.0
// str_cat() prints each argument as an ostream does: it appends strings and integers itself
// (an ostringstream per call was a sixth of a point-to-point op's time, issue 26) and must not
// print them any differently. The reference is an ostringstream fed the same arguments.
#include "src/base/strings.h"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include <catch2/catch.hpp>

namespace tutti::detail {
namespace {

template <class... Args>
std::string as_ostream_prints(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

enum class Colour { Red };
std::ostream& operator<<(std::ostream& out, Colour) { return out << "red"; }
enum Plain { kSeven = 7 };

TEST_CASE("str_cat prints integers at their limits as an ostream does", "[strings]") {
  CHECK(str_cat(std::numeric_limits<std::int64_t>::min()) ==
        as_ostream_prints(std::numeric_limits<std::int64_t>::min()));
  CHECK(str_cat(std::numeric_limits<std::uint64_t>::max()) == "18446744073709551615");
  CHECK(str_cat(std::numeric_limits<int>::min(), ' ', 0, ' ', -1) == "-2147483648 0 -1");
  CHECK(str_cat(short{-12}, 'x', std::size_t{42}) ==
        as_ostream_prints(short{-12}, 'x', std::size_t{42}));
}

TEST_CASE("str_cat prints characters, bools and strings as an ostream does", "[strings]") {
  const std::string owned = "owned";
  const std::string_view view = "view";
  const char* pointer = "pointer";
  char buffer[] = "buffer";
  const std::uint8_t byte = 65;  // An ostream prints it as 'A'.
  const signed char minus = '-';
  CHECK(str_cat(owned, view, pointer, buffer, "literal") == "ownedviewpointerbufferliteral");
  CHECK(str_cat(byte, minus, 'c', true, false) == as_ostream_prints(byte, minus, 'c', true, false));
  CHECK(str_cat(byte, minus, 'c', true, false) == "A-c10");
  CHECK(str_cat() == "");
  CHECK(str_cat(std::string()) == "");
}

TEST_CASE("str_cat leaves other types to an ostream", "[strings]") {
  CHECK(str_cat(0.1, ' ', 1e300, ' ', 2.5f, ' ', 1.0 / 3) ==
        as_ostream_prints(0.1, ' ', 1e300, ' ', 2.5f, ' ', 1.0 / 3));
  CHECK(str_cat(0.1, ' ', 2.5f) == "0.1 2.5");
  CHECK(str_cat(Colour::Red, ' ', kSeven) == "red 7");
}

TEST_CASE("str_cat prints nothing for a null C string, and goes on", "[strings]") {
  const char* null = nullptr;
  CHECK(str_cat("a", null, "b", 3) == "ab3");
}

}  // namespace
}  // namespace tutti::detail
