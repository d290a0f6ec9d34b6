// SPDX-License-Identifier: Apache-2.0
// Half-precision types and the pack/unpack conversion, against values worked out by hand; the
// array conversions (tutti::convert) against the element-wise ones, bit for bit.
#include "ops/convert.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include "tutti/error.h"
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

// Floats that probe every rounding decision of a 2-byte type whose values, as floats, have the
// bit patterns `exact` (sorted): each value, the midpoints to its neighbours, one float ulp
// either side of them, and a strided sweep of all float bit patterns (NaNs and infinities
// among them).
std::vector<float> probes(const std::vector<std::uint32_t>& exact) {
  std::vector<float> floats;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    const float value = std::bit_cast<float>(exact[i]);
    floats.push_back(value);
    if (i + 1 < exact.size()) {
      const float next = std::bit_cast<float>(exact[i + 1]);
      if (std::isfinite(value) && std::isfinite(next)) {
        const float mid = value + (next - value) / 2;  // Exact: both are floats of few bits.
        floats.push_back(mid);
        floats.push_back(std::nextafter(mid, -INFINITY));
        floats.push_back(std::nextafter(mid, INFINITY));
      }
    }
  }
  for (std::uint64_t bits = 0; bits <= 0xffffffffu; bits += 4099) {
    floats.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  }
  for (std::uint32_t nan : {0x7f800001u, 0x7fc00000u, 0x7fbfffffu, 0xffc00001u, 0x7f802000u}) {
    floats.push_back(std::bit_cast<float>(nan));
  }
  floats.push_back(1.0f);  // An odd count: the last elements take the scalar tail.
  return floats;
}

template <class Half>
std::vector<std::uint32_t> float_bits_of_every_half() {
  std::vector<std::uint32_t> bits;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    bits.push_back(std::bit_cast<std::uint32_t>(Half::to_float(static_cast<std::uint16_t>(h))));
  }
  return bits;
}

template <class Half>
void check_arrays_convert_as_elements() {
  // Every 2-byte pattern to float.
  std::vector<Half> halves(0x10000);
  for (std::uint32_t h = 0; h <= 0xffff; ++h) halves[h].bits = static_cast<std::uint16_t>(h);
  std::vector<float> floats(halves.size());
  convert(std::span<const Half>(halves), std::span<float>(floats));
  // The first difference, if any (one assertion, not one per element: the sanitizer builds
  // run this too).
  std::uint32_t h = 0;
  while (h <= 0xffff &&
         std::bit_cast<std::uint32_t>(floats[h]) ==
             std::bit_cast<std::uint32_t>(Half::to_float(static_cast<std::uint16_t>(h))))
    ++h;
  CHECK(h == 0x10000);
  // Floats to the 2-byte type: the values, around every midpoint between two halves of one
  // sign (the patterns sorted by magnitude within each sign), and a sweep.
  std::vector<std::uint32_t> exact = float_bits_of_every_half<Half>();
  exact.resize(0x8000);  // The positive patterns, in order of magnitude.
  std::vector<float> in = probes(exact);
  for (float& f : std::vector<float>(in)) in.push_back(-f);
  std::vector<Half> out(in.size());
  convert(std::span<const float>(in), std::span<Half>(out));
  std::size_t i = 0;
  while (i < in.size() && out[i].bits == Half::from_float(in[i])) ++i;
  INFO("float bits " << (i < in.size() ? std::bit_cast<std::uint32_t>(in[i]) : 0));
  CHECK(i == in.size());
  // Every length's tail.
  for (std::size_t n = 0; n < 20; ++n) {
    std::vector<Half> part(n);
    convert(std::span<const float>(in.data(), n), std::span<Half>(part));
    for (std::size_t k = 0; k < n; ++k) REQUIRE(part[k].bits == Half::from_float(in[k]));
  }
  std::vector<Half> short_by_one(2);
  const std::vector<float> three = {1, 2, 3};
  CHECK_THROWS_AS(convert(std::span<const float>(three), std::span<Half>(short_by_one)), Error);
}

TEST_CASE("Arrays of float16 convert exactly as their elements do", "[half]") {
  check_arrays_convert_as_elements<float16>();
}

TEST_CASE("Arrays of bfloat16 convert exactly as their elements do", "[half]") {
  check_arrays_convert_as_elements<bfloat16>();
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

// The element-wise reference: float(source) * factor, converted (ops/convert.h).
template <class D, class S>
D reference(S source, double factor) {
  return D(static_cast<float>(source) * static_cast<float>(factor));
}

template <class T>
std::uint32_t bits_of(T value) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(value);
  } else {
    return value.bits;
  }
}

template <class S, class D>
void check_convert_scale(DataType source_type, DataType destination_type) {
  std::vector<S> source;
  for (int i = 0; i < 2500; ++i) source.push_back(S(std::sin(0.37f * i) * std::exp2(i % 40 - 20)));
  for (double factor : {1.0, 0.5, 1.0 / 3}) {
    INFO("factor " << factor);
    std::vector<D> out(source.size());
    ops::cpu::convert_scale(out.data(), destination_type, source.data(), source_type, source.size(),
                            factor);
    for (std::size_t i = 0; i < source.size(); ++i) {
      REQUIRE(bits_of(out[i]) == bits_of(reference<D>(source[i], factor)));
    }
    if constexpr (std::is_same_v<S, D>) {  // In place.
      std::vector<S> data = source;
      ops::cpu::convert_scale(data.data(), source_type, data.data(), source_type, data.size(),
                              factor);
      for (std::size_t i = 0; i < data.size(); ++i)
        REQUIRE(bits_of(data[i]) == bits_of(reference<S>(source[i], factor)));
    }
  }
}

TEST_CASE("convert_scale between float, float16 and bfloat16 equals element-wise conversion",
          "[convert]") {
  check_convert_scale<float, float16>(DataType::Float32, DataType::Float16);
  check_convert_scale<float, bfloat16>(DataType::Float32, DataType::BFloat16);
  check_convert_scale<float16, float>(DataType::Float16, DataType::Float32);
  check_convert_scale<bfloat16, float>(DataType::BFloat16, DataType::Float32);
  check_convert_scale<float16, float16>(DataType::Float16, DataType::Float16);
  check_convert_scale<bfloat16, bfloat16>(DataType::BFloat16, DataType::BFloat16);
  check_convert_scale<float16, bfloat16>(DataType::Float16, DataType::BFloat16);
  check_convert_scale<bfloat16, float16>(DataType::BFloat16, DataType::Float16);
}

}  // namespace
}  // namespace tutti
