// SPDX-License-Identifier: Apache-2.0
// The compiler's code for this build's flags: GCC 12 with -march=native on recent Intel cores
// built a constant vector {1, 1, 0, 0} as {1, 1, 1, 1} (see meson.build). Values are built
// out of line so that the constant survives into the generated code.
#include <cstddef>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::test {
namespace {

__attribute__((noinline)) std::vector<std::size_t> ones_then_zeros() {
  return std::vector<std::size_t>{1, 1, 0, 0};
}
__attribute__((noinline)) std::vector<long long> mixed() { return {3, 3, -1, 0, 7, 7, 7, 2}; }

TEST_CASE("constant vectors are built as written", "[codegen]") {
  // Element by element: an expected vector built the same way would be miscompiled alike.
  const std::vector<std::size_t> v = ones_then_zeros();
  REQUIRE(v.size() == 4);
  CHECK(v[0] == 1);
  CHECK(v[1] == 1);
  CHECK(v[2] == 0);
  CHECK(v[3] == 0);
  const std::vector<long long> m = mixed();
  const long long expected[] = {3, 3, -1, 0, 7, 7, 7, 2};
  REQUIRE(m.size() == 8);
  for (std::size_t i = 0; i < m.size(); ++i) CHECK(m[i] == expected[i]);
}

}  // namespace
}  // namespace tutti::test
