// SPDX-License-Identifier: Apache-2.0
// Shapes whose element count overflows are refused (issue 11, defect 3): before, {2^62, 4}
// reported 0 elements and {3074457345618258603, 3} a negative count. And Tensor::empty.
#include <tutti/tensor.h>

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

#include "src/base/dtype.h"
#include "src/base/shape.h"
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

// Core's inline versions (src/base/shape.h, src/base/dtype.h), which the per-op paths use in
// place of the public calls: the same answers and errors as above, over any contiguous dims.
TEST_CASE("detail::num_elements counts dims held in place like num_elements", "[tensor]") {
  const std::int64_t in_place[] = {3, 4, 5};
  CHECK(detail::num_elements(in_place) == 60);
  CHECK(detail::num_elements(std::span<const std::int64_t>()) == 1);
  const std::int64_t zero[] = {kMax, 0, kMax};
  CHECK(detail::num_elements(zero) == 0);
  const std::int64_t overflow[] = {std::int64_t{1} << 62, 4};
  CHECK(error_of([&] { detail::num_elements(overflow); }) == ErrorCode::InvalidArgument);
  const std::int64_t negative[] = {2, -1};
  std::string message;
  CHECK(error_of([&] { detail::num_elements(negative); }, &message) == ErrorCode::InvalidArgument);
  CHECK(message == "negative dimension in shape [2, -1]");
}

TEST_CASE("detail::element_bytes and detail::floating agree with the DataType table", "[tensor]") {
  // API.md's sizes, spelled out rather than taken from element_size().
  const std::pair<DataType, std::size_t> sizes[] = {
      {DataType::UInt8, 1},   {DataType::Int8, 1},     {DataType::UInt16, 2},
      {DataType::Int16, 2},   {DataType::Int32, 4},    {DataType::Int64, 8},
      {DataType::Float16, 2}, {DataType::BFloat16, 2}, {DataType::Float32, 4},
      {DataType::Float64, 8}, {DataType::Bool, 1}};
  for (const auto& [dtype, bytes] : sizes) {
    CAPTURE(to_string(dtype));
    CHECK(detail::element_bytes(dtype) == bytes);
    const bool floating = dtype == DataType::Float16 || dtype == DataType::BFloat16 ||
                          dtype == DataType::Float32 || dtype == DataType::Float64;
    CHECK(detail::floating(dtype) == floating);
  }
  CHECK(error_of([] { detail::element_bytes(static_cast<DataType>(42)); }) ==
        ErrorCode::InvalidArgument);
}

TEST_CASE("Tensor::empty has the constructor's shape, dtype and checks, and its own storage",
          "[tensor]") {
  Tensor a = Tensor::empty(DataType::Float64, {3, 4});
  CHECK(a.dtype() == DataType::Float64);
  CHECK(a.shape() == Shape{3, 4});
  CHECK(a.byte_size() == 96);
  CHECK(a.data() != nullptr);
  for (double& x : a.span<double>()) x = 2.5;  // Writable, whole.
  const Tensor b = Tensor::empty(DataType::Float64, {3, 4});
  CHECK(b.data() != a.data());
  CHECK(Tensor::empty(DataType::UInt8, {0}).data() != nullptr);  // Never null, as the constructor.
  CHECK(error_of([] { Tensor::empty(DataType::Float32, {2, -1}); }) == ErrorCode::InvalidArgument);
  // from() and clone() build on it and write every element.
  const Tensor c = Tensor::from<std::int32_t>(std::span<const std::int32_t>({7, 8, 9}), {3});
  const Tensor d = c.clone();
  CHECK(d.span<std::int32_t>()[2] == 9);
  CHECK(d.data() != c.data());
}
