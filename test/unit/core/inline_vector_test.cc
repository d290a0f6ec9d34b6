// SPDX-License-Identifier: Apache-2.0
// InlineVector: elements in place up to N, then on the heap; copies, moves and clears keep
// every element constructed exactly once (a counting element type checks it).
#include "src/base/inline_vector.h"

#include <span>
#include <string>

#include <catch2/catch.hpp>

namespace tutti::base {
namespace {

// Counts live objects, so that a leak or a double destruction shows as a wrong count.
struct Counted {
  static inline int live = 0;
  std::string value;  // Heap-backed past SSO: a moved-from or destroyed one would show.
  explicit Counted(std::string v) : value(std::move(v)) { ++live; }
  Counted(const Counted& other) : value(other.value) { ++live; }
  Counted(Counted&& other) noexcept : value(std::move(other.value)) { ++live; }
  Counted& operator=(const Counted&) = default;
  Counted& operator=(Counted&&) noexcept = default;
  ~Counted() { --live; }
};

std::string long_text(int i) {
  return "a value longer than the small-string buffer #" + std::to_string(i);
}

std::vector<std::string> values_of(const InlineVector<Counted, 2>& v) {
  std::vector<std::string> out;
  for (const Counted& c : v) out.push_back(c.value);
  return out;
}

TEST_CASE("InlineVector keeps N elements in place, then all on the heap", "[inline_vector]") {
  const int n = GENERATE(0, 1, 2, 3, 7);
  {
    InlineVector<Counted, 2> v;
    std::vector<std::string> expected;
    for (int i = 0; i < n; ++i) {
      v.emplace_back(long_text(i));
      expected.push_back(long_text(i));
    }
    CHECK(v.size() == static_cast<std::size_t>(n));
    CHECK(v.empty() == (n == 0));
    CHECK(values_of(v) == expected);
    CHECK(std::span<const Counted>(v).size() == static_cast<std::size_t>(n));  // Contiguous.
    CHECK(Counted::live == n);

    InlineVector<Counted, 2> copy = v;
    CHECK(values_of(copy) == expected);
    CHECK(Counted::live == 2 * n);
    InlineVector<Counted, 2> moved = std::move(copy);
    CHECK(values_of(moved) == expected);
    CHECK(copy.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract.
    CHECK(Counted::live == 2 * n);

    InlineVector<Counted, 2> assigned{Counted("x")};
    assigned = moved;
    CHECK(values_of(assigned) == expected);
    assigned = std::move(moved);
    CHECK(values_of(assigned) == expected);
    CHECK(Counted::live == 2 * n);

    v.clear();
    CHECK(v.empty());
    CHECK(Counted::live == n);
    v.push_back(Counted("again"));
    CHECK(v.front().value == "again");
    CHECK(v.back().value == "again");
  }
  CHECK(Counted::live == 0);
}

TEST_CASE("InlineVector assigns from a list and reserves past N", "[inline_vector]") {
  {
    InlineVector<Counted, 2> v;
    v = {Counted("a"), Counted("b"), Counted("c")};
    CHECK(values_of(v) == std::vector<std::string>{"a", "b", "c"});
    v.reserve(10);
    CHECK(values_of(v) == std::vector<std::string>{"a", "b", "c"});
    v[1].value = "B";
    CHECK(values_of(v) == std::vector<std::string>{"a", "B", "c"});
    InlineVector<Counted, 2> w;
    w.reserve(5);  // Spills before any element.
    w.push_back(Counted("z"));
    CHECK(values_of(w) == std::vector<std::string>{"z"});
    CHECK(Counted::live == 4);
  }
  CHECK(Counted::live == 0);
}

}  // namespace
}  // namespace tutti::base
