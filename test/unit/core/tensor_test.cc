// SPDX-License-Identifier: Apache-2.0
// Shapes whose element count overflows are refused (issue 11, defect 3): before, {2^62, 4}
// reported 0 elements and {3074457345618258603, 3} a negative count.
#include <tutti/tensor.h>

#include <cstdint>
#include <limits>
#include <string>

#include <catch2/catch.hpp>

#include "test/support/error_of.h"

using namespace tutti;
using tutti::test::error_of;

namespace {
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
}  // namespace

TEST_CASE("num_elements is the product of the dimensions", "[tensor]") {
  CHECK(num_elements({}) == 1);
  CHECK(num_elements({3, 4, 5}) == 60);
  CHECK(num_elements({0, kMax, kMax}) == 0);  // A zero dimension wins over the others.
  CHECK(num_elements({kMax}) == kMax);
  CHECK(num_elements({std::int64_t{1} << 31, 3}) == (std::int64_t{1} << 31) * 3);
}

TEST_CASE("shapes whose element count overflows int64 are InvalidArgument", "[tensor]") {
  std::string message;
  CHECK(error_of(
            [] {
              num_elements({std::int64_t{1} << 62, 4});
            },
            &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("int64") != std::string::npos);
  CHECK(error_of([] {
          num_elements({(std::int64_t{1} << 62) + 1, 4});
        }) == ErrorCode::InvalidArgument);
  CHECK(error_of([] { num_elements({3074457345618258603, 3}); }) == ErrorCode::InvalidArgument);
  CHECK(error_of([] { num_elements({kMax, 2}); }) == ErrorCode::InvalidArgument);
  CHECK(error_of([] { num_elements({-1, 4}); }) == ErrorCode::InvalidArgument);
}

TEST_CASE("a TensorView refuses shapes that overflow, in elements or in bytes", "[tensor]") {
  float f = 0;
  CHECK(error_of([&] {
          TensorView(&f, {std::int64_t{1} << 62, 4});
        }) == ErrorCode::InvalidArgument);
  CHECK(error_of([&] { TensorView(&f, {3074457345618258603, 3}); }) == ErrorCode::InvalidArgument);
  // 2^62 floats are 2^64 bytes: the count fits, the size in bytes does not.
  std::string message;
  CHECK(error_of([&] { TensorView(&f, {std::int64_t{1} << 62}); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("bytes") != std::string::npos);
  // 2^60 bytes as uint8 is representable (the view does not touch the memory).
  std::uint8_t b = 0;
  CHECK(TensorView(&b, {std::int64_t{1} << 60}).num_elements() == std::int64_t{1} << 60);
  CHECK(error_of([&] {
          Tensor(DataType::Float64, {std::int64_t{1} << 61, 2});
        }) == ErrorCode::InvalidArgument);
}
