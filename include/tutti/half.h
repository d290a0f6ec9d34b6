// SPDX-License-Identifier: Apache-2.0
// 2-byte floating storage types. Arithmetic happens in float: convert, compute, convert back.
// Conversions round to nearest even, keep infinities and NaN, and flush nothing.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

#include "tutti/export.h"

namespace tutti {

// IEEE 754 binary16. Named like a built-in type, as API.md spells it.
struct float16 {  // NOLINT(readability-identifier-naming)
  std::uint16_t bits = 0;

  float16() = default;
  float16(float value) : bits(from_float(value)) {}  // NOLINT(google-explicit-constructor)
  operator float() const { return to_float(bits); }  // NOLINT(google-explicit-constructor)

  static constexpr std::uint16_t from_float(float value) {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = (f >> 16) & 0x8000u;
    const std::uint32_t abs = f & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // Inf or NaN; NaN keeps a quiet payload bit.
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // Overflow.
    if (abs < 0x38800000u) {  // Result is subnormal (or zero): shift the mantissa into place.
      if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // Below half the smallest.
      const std::uint32_t exponent = abs >> 23;
      const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - exponent;  // 14..24
      std::uint32_t half = mantissa >> shift;
      const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1u);
      if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
      return static_cast<std::uint16_t>(sign | half);
    }
    // Normal: rebias the exponent, round the dropped 13 bits to nearest even.
    std::uint32_t half = ((abs - 0x38000000u) >> 13);
    const std::uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }

  static constexpr float to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    if (exponent != 0)
      return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal half: normalize into a float.
    std::uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
  }
};

// bfloat16: the upper half of a float32. Named like a built-in type, as API.md spells it.
struct bfloat16 {  // NOLINT(readability-identifier-naming)
  std::uint16_t bits = 0;

  bfloat16() = default;
  bfloat16(float value) : bits(from_float(value)) {}  // NOLINT(google-explicit-constructor)
  operator float() const { return to_float(bits); }   // NOLINT(google-explicit-constructor)

  static constexpr std::uint16_t from_float(float value) {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    if ((f & 0x7fffffffu) > 0x7f800000u)
      return static_cast<std::uint16_t>((f >> 16) | 0x40u);     // NaN
    const std::uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);  // Nearest even.
    return static_cast<std::uint16_t>((f + rounding) >> 16);
  }
  static constexpr float to_float(std::uint16_t b) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
  }
};

// Tutti addition: whole arrays converted, each element exactly as the conversions above convert
// it, NaNs included, but vectorized (with x86's F16C instructions where the CPU has them; see
// Note [Converting arrays of halves] in src/base/half.cc). `to` must have as many elements as
// `from` (else InvalidArgument) and must not overlap it.
TUTTI_API void convert(std::span<const float> from, std::span<float16> to);
TUTTI_API void convert(std::span<const float16> from, std::span<float> to);
TUTTI_API void convert(std::span<const float> from, std::span<bfloat16> to);
TUTTI_API void convert(std::span<const bfloat16> from, std::span<float> to);

}  // namespace tutti
