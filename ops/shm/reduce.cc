// SPDX-License-Identifier: Apache-2.0
// Like ops/cpu/convert.cc, these loops run over every reduced byte and are compiled for
// vectorization (gcc's -O2 cost model leaves them scalar), and in a portable x86-64 build also
// for AVX2 (Note [Kernel ISA] in ops/cpu/kernel_isa.h).
#if !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "ops/shm/reduce.h"

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/kernel_isa.h"
#include "src/common/check.h"

namespace tutti::ops::cpu {
namespace {

// Signed overflow is undefined in C++ but wraps in MPI: integer sums and products are done
// in the unsigned type of the same width, which wraps by definition.
template <class T>
struct ArithmeticOf {
  using type = T;
};
template <std::integral T>
struct ArithmeticOf<T> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using Arithmetic = typename ArithmeticOf<T>::type;

template <class T>
struct Sum {
  T operator()(T a, T b) const {
    using A = Arithmetic<T>;
    return static_cast<T>(static_cast<A>(static_cast<A>(a) + static_cast<A>(b)));
  }
};
template <class T>
struct Product {
  T operator()(T a, T b) const {
    using A = Arithmetic<T>;
    return static_cast<T>(static_cast<A>(static_cast<A>(a) * static_cast<A>(b)));
  }
};
// MPI_MIN/MPI_MAX's definition, (a < b) ? a : b, which also fixes what a NaN gives.
template <class T>
struct Min {
  T operator()(T a, T b) const { return b < a ? b : a; }
};
template <class T>
struct Max {
  T operator()(T a, T b) const { return a < b ? b : a; }
};

// Always inlined, so that each caller compiles the loops for its own target.
template <class T, template <class> class Op>
[[gnu::always_inline]] inline void reduce_all(void* destination,
                                              std::span<const void* const> sources,
                                              std::size_t count) {
  auto* d = static_cast<T*>(destination);
  if (sources.size() == 1) {
    if (d != sources[0]) std::copy_n(static_cast<const T*>(sources[0]), count, d);
    return;
  }
  // Two sources at a time, the first pass writing the destination. A source the destination
  // aliases goes into that first pass, which reads each element before writing it; later
  // passes read the destination back, in cache (a slice is at most one rank's share of a
  // shared-memory chunk, a few hundred KB).
  std::size_t first = 0;
  for (std::size_t s = 0; s < sources.size(); ++s) {
    if (sources[s] == destination) first = s;
  }
  const std::size_t second = first == 0 ? 1 : 0;
  const auto* a = static_cast<const T*>(sources[first]);
  const auto* b = static_cast<const T*>(sources[second]);
  Op<T> op;
  for (std::size_t i = 0; i < count; ++i) d[i] = op(a[i], b[i]);
  for (std::size_t s = 0; s < sources.size(); ++s) {
    if (s == first || s == second) continue;
    const auto* next = static_cast<const T*>(sources[s]);
    for (std::size_t i = 0; i < count; ++i) d[i] = op(d[i], next[i]);
  }
}

#if TUTTI_KERNEL_AVX2_CLONES
template <class T, template <class> class Op>
TUTTI_TARGET_AVX2 void reduce_all_avx2(void* destination, std::span<const void* const> sources,
                                       std::size_t count) {
  reduce_all<T, Op>(destination, sources, count);
}
#endif

template <class T, template <class> class Op>
void reduce_in_isa(void* destination, std::span<const void* const> sources, std::size_t count) {
#if TUTTI_KERNEL_AVX2_CLONES
  if (use_avx2(count * sizeof(T))) return reduce_all_avx2<T, Op>(destination, sources, count);
#endif
  reduce_all<T, Op>(destination, sources, count);
}

template <class T>
void reduce_typed(void* destination, std::span<const void* const> sources, std::size_t count,
                  WireOp op) {
  switch (op) {
    case WireOp::Sum: return reduce_in_isa<T, Sum>(destination, sources, count);
    case WireOp::Product: return reduce_in_isa<T, Product>(destination, sources, count);
    case WireOp::Min: return reduce_in_isa<T, Min>(destination, sources, count);
    case WireOp::Max: return reduce_in_isa<T, Max>(destination, sources, count);
  }
  TUTTI_CHECK(false, "WireOp ", static_cast<int>(op), " has no reduction");
}

}  // namespace

void reduce(void* destination, std::span<const void* const> sources, std::size_t count,
            DataType dtype, WireOp op) {
  TUTTI_CHECK(!sources.empty(), "a reduction needs at least one source");
  if (count == 0) return;
  switch (dtype) {
    case DataType::UInt8: return reduce_typed<std::uint8_t>(destination, sources, count, op);
    case DataType::Int8: return reduce_typed<std::int8_t>(destination, sources, count, op);
    case DataType::UInt16: return reduce_typed<std::uint16_t>(destination, sources, count, op);
    case DataType::Int16: return reduce_typed<std::int16_t>(destination, sources, count, op);
    case DataType::Int32: return reduce_typed<std::int32_t>(destination, sources, count, op);
    case DataType::Int64: return reduce_typed<std::int64_t>(destination, sources, count, op);
    case DataType::Float32: return reduce_typed<float>(destination, sources, count, op);
    case DataType::Float64: return reduce_typed<double>(destination, sources, count, op);
    case DataType::Bool:
      // Stored as one byte 0 or 1: Min is logical and, Max logical or.
      TUTTI_CHECK(op == WireOp::Min || op == WireOp::Max, "bool reduces only with Min/Max");
      return reduce_typed<std::uint8_t>(destination, sources, count, op);
    case DataType::Float16:
    case DataType::BFloat16: break;
  }
  TUTTI_CHECK(false, "DataType ", static_cast<int>(dtype), " is not reduced on the host");
}

}  // namespace tutti::ops::cpu
