// SPDX-License-Identifier: Apache-2.0
// InlineString: up to 31 characters in place, longer ones on the heap; every copy, move and
// assignment, between the two kinds and within one string, against std::string's results.
#include "src/base/inline_string.h"

#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::base {
namespace {

// "abc...": `n` characters, none of them '\0', different at every place mod 26.
std::string text(std::size_t n, char first = 'a') {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<char>(first + static_cast<char>(i % 26));
  return s;
}

// The whole observable state of `s` against `expected`.
void check_holds(const InlineString& s, const std::string& expected) {
  REQUIRE(s.size() == expected.size());
  CHECK(s.empty() == expected.empty());
  CHECK(std::string(s.data(), s.size()) == expected);
  CHECK(s.c_str()[s.size()] == '\0');  // Terminated, as std::string's c_str() is.
  CHECK(std::string(s.begin(), s.end()) == expected);
  CHECK(s.view() == expected);
  CHECK(s.str() == expected);
}

TEST_CASE("InlineString is as small as std::string", "[inline_string]") {
  CHECK(sizeof(InlineString) == 32);
  CHECK(sizeof(InlineString) == sizeof(std::string));
}

TEST_CASE("InlineString holds names of every length", "[inline_string]") {
  // 31 is the last length in place (its terminator is the length byte), 32 the first on the heap.
  const std::size_t n = GENERATE(0, 1, 15, 16, 30, 31, 32, 33, 100, 1000);
  const std::string expected = text(n);
  check_holds(InlineString(expected), expected);
  check_holds(InlineString(std::string_view(expected)), expected);
  check_holds(InlineString(expected.c_str()), expected);
  InlineString assigned;
  assigned = expected;
  check_holds(assigned, expected);
  check_holds(InlineString(), "");
}

TEST_CASE("InlineString takes an empty view whose data is null", "[inline_string]") {
  // A decoder's name before it is read; memcpy() from null is undefined even for 0 bytes.
  check_holds(InlineString(std::string_view()), "");
  InlineString s(text(40));
  s = std::string_view();
  check_holds(s, "");
  s = text(5);
  s.assign(std::string_view());
  check_holds(s, "");
}

TEST_CASE("InlineString copies, moves and assigns between in place and heap", "[inline_string]") {
  const std::size_t from_size = GENERATE(0, 7, 31, 32, 64);
  const std::size_t to_size = GENERATE(0, 9, 31, 32, 80);
  const std::string from_text = text(from_size, 'a');
  const std::string to_text = text(to_size, 'A');

  SECTION("copy construction") {
    const InlineString from(from_text);
    const InlineString copy(from);
    check_holds(copy, from_text);
    check_holds(from, from_text);
  }
  SECTION("move construction leaves the source empty") {
    InlineString from(from_text);
    const InlineString moved(std::move(from));
    check_holds(moved, from_text);
    check_holds(from, "");  // NOLINT(bugprone-use-after-move): its state is specified.
  }
  SECTION("copy assignment") {
    const InlineString from(from_text);
    InlineString to(to_text);
    to = from;
    check_holds(to, from_text);
    check_holds(from, from_text);
  }
  SECTION("move assignment") {
    InlineString from(from_text);
    InlineString to(to_text);
    to = std::move(from);
    check_holds(to, from_text);
    check_holds(from, "");  // NOLINT(bugprone-use-after-move)
  }
  SECTION("assignment of a view") {
    InlineString to(to_text);
    to = std::string_view(from_text);
    check_holds(to, from_text);
  }
}

TEST_CASE("InlineString assigns a part of itself", "[inline_string]") {
  const std::size_t n = GENERATE(10, 31, 32, 40, 200);
  const std::string whole = text(n);
  const std::size_t skip = GENERATE(0, 1, 5);
  const std::size_t keep = GENERATE(0, 3, 31, 35);
  if (skip + keep > n) return;
  InlineString s(whole);
  s.assign(s.view().substr(skip, keep));
  check_holds(s, whole.substr(skip, keep));
}

TEST_CASE("InlineString assigned to itself is unchanged", "[inline_string]") {
  const std::size_t n = GENERATE(0, 20, 31, 32, 90);
  InlineString s(text(n));
  InlineString& same = s;
  s = same;
  check_holds(s, text(n));
  s = std::move(same);
  check_holds(s, text(n));
}

TEST_CASE("InlineString compares, hashes and prints as its characters do", "[inline_string]") {
  const std::vector<std::string> texts = {
      "",       "a",           "ab",     "b",           text(31),
      text(32), text(31, 'b'), text(40), text(40, 'c'), "allreduce.noname.17"};
  for (const std::string& a : texts) {
    for (const std::string& b : texts) {
      const InlineString x(a);
      const InlineString y(b);
      CHECK((x == y) == (a == b));
      CHECK((x == std::string_view(b)) == (a == b));
      CHECK((x == b) == (a == b));
      CHECK((x == b.c_str()) == (a == b));
      CHECK((x <=> y) == (a <=> b));
      CHECK((x < std::string_view(b)) == (a < b));
    }
    CHECK(std::hash<InlineString>()(InlineString(a)) == std::hash<std::string_view>()(a));
    std::ostringstream printed;
    printed << InlineString(a);
    CHECK(printed.str() == a);
  }
}

}  // namespace
}  // namespace tutti::base
