// SPDX-License-Identifier: Apache-2.0
// Half-precision types and the pack/unpack conversion, against values worked out by hand.
#include "ops/convert.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "tutti/half.h"

namespace tutti {
namespace {

TEST_CASE("float16 conversions round to nearest even and keep specials", "[half]") {
  CHECK(float16(1.0f).bits == 0x3c00);
  CHECK(float16(-2.0f).bits == 0xc000);
  CHECK(float16(65504.0f).bits == 0x7bff);            // Largest finite.
  CHECK(float16(1e6f).bits == 0x7c00);                // Overflow to infinity.
  CHECK(float16(5.960464477539063e-08f).bits == 1);   // Smallest subnormal.
  CHECK(float16(1.0f + 1.0f / 2048).bits == 0x3c00);  // Halfway: rounds to even.
  CHECK(float16(1.0f + 3.0f / 2048).bits == 0x3c02);  // Halfway: rounds to even (up).
  CHECK(std::isnan(static_cast<float>(float16(std::numeric_limits<float>::quiet_NaN()))));
  for (std::uint32_t bits = 0; bits < 0x7c00; ++bits) {  // Every finite half round-trips.
    const float16 h = float16::to_float(static_cast<std::uint16_t>(bits));
    REQUIRE(h.bits == bits);
  }
}

TEST_CASE("bfloat16 is the upper half of a float, rounded to nearest even", "[half]") {
  CHECK(bfloat16(1.0f).bits == 0x3f80);
  CHECK(bfloat16(1.0f + 1.0f / 256).bits == 0x3f80);  // Halfway: even.
  CHECK(bfloat16(1.0f + 3.0f / 256).bits == 0x3f82);
  CHECK(static_cast<float>(bfloat16(3.0f)) == 3.0f);
}

TEST_CASE("convert_scale truncates toward zero and saturates for integers", "[convert]") {
  const std::vector<double> in = {2.9, -2.9, 1e12, -1e12, 7.0};
  std::vector<std::int32_t> out(in.size());
  ops::cpu::convert_scale(out.data(), DataType::Int32, in.data(), DataType::Float64, in.size(),
                          1.0);
  CHECK(out == std::vector<std::int32_t>{2, -2, 2147483647, -2147483648, 7});
  std::vector<std::uint8_t> bytes(1);
  const double half_of_five = 5.0;
  ops::cpu::convert_scale(bytes.data(), DataType::UInt8, &half_of_five, DataType::Float64, 1, 0.5);
  CHECK(bytes[0] == 2);
}

TEST_CASE("convert_scale widens halves and scales in place", "[convert]") {
  std::vector<float16> halves = {float16(1.5f), float16(-3.0f)};
  std::vector<float> floats(2);
  ops::cpu::convert_scale(floats.data(), DataType::Float32, halves.data(), DataType::Float16, 2,
                          2.0);
  CHECK(floats == std::vector<float>{3.0f, -6.0f});
  ops::cpu::convert_scale(floats.data(), DataType::Float32, floats.data(), DataType::Float32, 2,
                          0.5);
  CHECK(floats == std::vector<float>{1.5f, -3.0f});
}

}  // namespace
}  // namespace tutti
