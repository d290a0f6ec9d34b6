// SPDX-License-Identifier: Apache-2.0
// The loops here run over every fused byte, so they are compiled for vectorization: -O2's
// cheap cost model leaves `d[i] = s[i] * f` scalar, which made unpack 2x slower than memcpy.
// (clang vectorizes them at -O2 already and has no such pragma.) In a portable x86-64 build the
// scaling loops are also compiled for AVX2 (Note [Kernel ISA] in ops/cpu/kernel_isa.h).
#if !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "ops/convert.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>

#include "ops/cpu/kernel_isa.h"
#include "src/common/check.h"
#include "tutti/half.h"

namespace tutti::ops::cpu {
namespace {

template <class T>
constexpr bool kIsNarrowFloat =
    std::is_same_v<T, float> || std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

template <class D, class C>
D narrow(C value) {
  if constexpr (std::is_same_v<D, bool>) {
    return value != C(0);
  } else if constexpr (std::is_integral_v<D>) {
    // Saturate instead of undefined behaviour; NaN becomes 0.
    if (!(value == value)) return D(0);
    if (value >= static_cast<C>(std::numeric_limits<D>::max()))
      return std::numeric_limits<D>::max();
    if (value <= static_cast<C>(std::numeric_limits<D>::lowest()))
      return std::numeric_limits<D>::lowest();
    return static_cast<D>(value);  // Truncates toward zero.
  } else {
    return static_cast<D>(value);
  }
}

// No __restrict: scaling in place (destination == source) is a legal use; -O3 versions the
// loop with a runtime overlap check instead. Always inlined, so that each caller compiles the
// loop for its own target.
template <class S, class D>
[[gnu::always_inline]] inline void convert_loop(D* destination, const S* source, std::size_t count,
                                                double factor) {
  // float arithmetic where both sides fit in float (API.md: half types reduced in float32).
  using Compute = std::conditional_t<kIsNarrowFloat<S> && kIsNarrowFloat<D>, float, double>;
  const Compute f = static_cast<Compute>(factor);
  if (factor == 1.0) {
    for (std::size_t i = 0; i < count; ++i)
      destination[i] = narrow<D>(static_cast<Compute>(source[i]));
  } else {
    for (std::size_t i = 0; i < count; ++i)
      destination[i] = narrow<D>(static_cast<Compute>(source[i]) * f);
  }
}

#if TUTTI_KERNEL_AVX2_CLONES
template <class T>
TUTTI_TARGET_AVX2 void scale_loop_avx2(T* destination, const T* source, std::size_t count,
                                       double factor) {
  convert_loop<T, T>(destination, source, count, factor);
}
#endif

// A tensor scaled in its own type (pre- and postscale, Average): fusion's hot case, which runs
// in AVX2 where Note [Kernel ISA] allows. Conversions between types stay in the baseline.
template <class T>
void scale_loop(T* destination, const T* source, std::size_t count, double factor) {
#if TUTTI_KERNEL_AVX2_CLONES
  if (use_avx2(count * sizeof(T))) return scale_loop_avx2(destination, source, count, factor);
#endif
  convert_loop<T, T>(destination, source, count, factor);
}

template <class F>
void with_type(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::UInt8: return f(std::uint8_t{});
    case DataType::Int8: return f(std::int8_t{});
    case DataType::UInt16: return f(std::uint16_t{});
    case DataType::Int16: return f(std::int16_t{});
    case DataType::Int32: return f(std::int32_t{});
    case DataType::Int64: return f(std::int64_t{});
    case DataType::Float16: return f(float16{});
    case DataType::BFloat16: return f(bfloat16{});
    case DataType::Float32: return f(float{});
    case DataType::Float64: return f(double{});
    case DataType::Bool: return f(bool{});
  }
  TUTTI_CHECK(false, "DataType ", static_cast<int>(dtype), " has no element type");
}

bool is_narrow_float(DataType type) {
  return type == DataType::Float32 || type == DataType::Float16 || type == DataType::BFloat16;
}

// Elements [at, at + n) of `source`, a Float32, Float16 or BFloat16 array, into `out` as floats.
void widen(const void* source, DataType type, std::size_t at, std::size_t n, float* out) {
  const std::span<float> to(out, n);
  switch (type) {
    case DataType::Float16:
      return convert(std::span(static_cast<const float16*>(source) + at, n), to);
    case DataType::BFloat16:
      return convert(std::span(static_cast<const bfloat16*>(source) + at, n), to);
    default: std::memcpy(out, static_cast<const float*>(source) + at, n * sizeof(float));
  }
}

// `n` floats into elements [at, at + n) of `destination`, a Float32, Float16 or BFloat16 array.
void narrow(const float* in, std::size_t n, void* destination, DataType type, std::size_t at) {
  const std::span<const float> from(in, n);
  switch (type) {
    case DataType::Float16:
      return convert(from, std::span(static_cast<float16*>(destination) + at, n));
    case DataType::BFloat16:
      return convert(from, std::span(static_cast<bfloat16*>(destination) + at, n));
    default: std::memcpy(static_cast<float*>(destination) + at, in, n * sizeof(float));
  }
}

// Float16 and BFloat16 to or from float, or to each other: tutti::convert's vectorized loops
// (Note [Converting arrays of halves] in src/base/half.cc), through a block of floats where
// there is scaling to do or both sides are 2-byte types. The same results as convert_loop's,
// which converted one element at a time; in place too (destination == source), as a block is
// read whole before it is written. False for any other pair of types.
bool convert_halves(void* destination, DataType destination_type, const void* source,
                    DataType source_type, std::size_t count, double factor) {
  if (!is_narrow_float(source_type) || !is_narrow_float(destination_type) ||
      (source_type == DataType::Float32 && destination_type == DataType::Float32)) {
    return false;
  }
  if (factor == 1.0 && source_type == DataType::Float32) {
    narrow(static_cast<const float*>(source), count, destination, destination_type, 0);
    return true;
  }
  if (factor == 1.0 && destination_type == DataType::Float32) {
    widen(source, source_type, 0, count, static_cast<float*>(destination));
    return true;
  }
  constexpr std::size_t kBlock = 1024;  // 4 KiB of floats: stays in L1 between the passes.
  float block[kBlock];
  const auto f = static_cast<float>(factor);
  for (std::size_t at = 0; at < count; at += kBlock) {
    const std::size_t n = std::min(kBlock, count - at);
    widen(source, source_type, at, n, block);
    if (factor != 1.0) {
      for (std::size_t i = 0; i < n; ++i) block[i] *= f;
    }
    narrow(block, n, destination, destination_type, at);
  }
  return true;
}

}  // namespace

void convert_elements(void* destination, DataType destination_type, const void* source,
                      DataType source_type, std::size_t count, double factor) {
  if (convert_halves(destination, destination_type, source, source_type, count, factor)) return;
  with_type(source_type, [&](auto s) {
    with_type(destination_type, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      if constexpr (std::is_same_v<S, D>) {
        scale_loop<S>(static_cast<D*>(destination), static_cast<const S*>(source), count, factor);
      } else {
        convert_loop<S, D>(static_cast<D*>(destination), static_cast<const S*>(source), count,
                           factor);
      }
    });
  });
}

}  // namespace tutti::ops::cpu
