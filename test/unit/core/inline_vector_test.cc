// SPDX-License-Identifier: Apache-2.0
// InlineVector: elements in place up to N, then on the heap; copies, moves and clears keep
// every element constructed exactly once (a counting element type checks it).
#include "src/base/inline_vector.h"

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

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

// What TensorSpec's Dims and TensorSpecs use: resize, assign, at, equality with each other and
// with a std::vector, and construction from one.
TEST_CASE("InlineVector resizes, assigns and compares like std::vector", "[inline_vector]") {
  const std::size_t n = GENERATE(0u, 2u, 3u, 6u);  // Around N = 3.
  std::vector<std::string> expected;
  for (std::size_t i = 0; i < n; ++i) expected.push_back(long_text(static_cast<int>(i)));
  const InlineVector<std::string, 3> from_vector = expected;
  CHECK(from_vector == expected);
  CHECK(std::vector<std::string>(from_vector.begin(), from_vector.end()) == expected);
  CHECK(from_vector.to_vector() == expected);

  InlineVector<std::string, 3> v(std::span<const std::string>(expected.data(), expected.size()));
  CHECK(v == from_vector);
  v.resize(n + 2);  // Grows with empty strings, across N for n = 2.
  CHECK(v.size() == n + 2);
  CHECK(v[n].empty());
  CHECK(v[n + 1].empty());
  CHECK_FALSE(v == from_vector);
  v.resize(n);
  CHECK(v == expected);
  v.resize(1);
  CHECK(v.size() == 1);
  if (n > 0) CHECK(v.at(0) == expected[0]);
  CHECK_THROWS_AS(v.at(1), std::out_of_range);

  v.assign(std::span<const std::string>(expected.data(), expected.size()));
  CHECK(v == expected);
  if (n > 0) {
    InlineVector<std::string, 3> other = v;
    other.back() += "!";
    CHECK_FALSE(other == v);  // Same size, one element differs.
  }
}

TEST_CASE("InlineVector of numbers value-initializes what resize adds", "[inline_vector]") {
  InlineVector<std::int64_t, 4> dims{7, 8};
  dims.resize(6);  // Past N: onto the heap.
  CHECK(dims == std::vector<std::int64_t>{7, 8, 0, 0, 0, 0});
  dims.resize(1);
  CHECK(dims == std::vector<std::int64_t>{7});
}

// Note [Compact inline vector]: 8 bytes beside the in-place elements (or a pointer).
TEST_CASE("InlineVector costs 8 bytes beside its in-place elements", "[inline_vector]") {
  STATIC_REQUIRE(sizeof(InlineVector<std::int64_t, 4>) == 4 * sizeof(std::int64_t) + 8);
  STATIC_REQUIRE(sizeof(InlineVector<std::string, 1>) == sizeof(std::string) + 8);
  STATIC_REQUIRE(sizeof(InlineVector<char, 1>) == sizeof(void*) + 8);
}

TEST_CASE("InlineVector appends one of its own elements as it grows", "[inline_vector]") {
  {
    InlineVector<Counted, 2> v;
    v.emplace_back(long_text(0));
    v.push_back(v[0]);  // Room in place.
    v.push_back(v[0]);  // Full in place: the copy is made before the elements move out.
    v.push_back(v[2]);  // Full at 4 on the heap: the same as it moves again.
    v.push_back(v.back());
    CHECK(values_of(v) == std::vector<std::string>(5, long_text(0)));
    CHECK(Counted::live == 5);
  }
  CHECK(Counted::live == 0);
}

TEST_CASE("InlineVector hands its heap buffer over on a move, and is reusable after",
          "[inline_vector]") {
  {
    InlineVector<Counted, 2> spilled;
    for (int i = 0; i < 5; ++i) spilled.emplace_back(long_text(i));
    const Counted* buffer = spilled.data();
    InlineVector<Counted, 2> moved = std::move(spilled);
    CHECK(moved.data() == buffer);  // No element moved one by one.
    CHECK(spilled.empty());         // NOLINT(bugprone-use-after-move): empty by contract.
    spilled.emplace_back(long_text(9));
    spilled.emplace_back(long_text(8));
    spilled.emplace_back(long_text(7));  // Spills again, into a buffer of its own.
    CHECK(values_of(spilled) == std::vector<std::string>{long_text(9), long_text(8), long_text(7)});

    InlineVector<Counted, 2> target;
    for (int i = 0; i < 3; ++i) target.emplace_back(long_text(20 + i));  // On the heap too.
    target = std::move(moved);  // Its own buffer is freed (ASan's leak check would see it).
    CHECK(target.data() == buffer);
    CHECK(target.size() == 5);
    CHECK(Counted::live == 8);
    target = InlineVector<Counted, 2>{Counted("small")};  // Back in place from the heap.
    CHECK(values_of(target) == std::vector<std::string>{"small"});
  }
  CHECK(Counted::live == 0);
}

}  // namespace
}  // namespace tutti::base
