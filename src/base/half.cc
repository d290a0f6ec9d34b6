// SPDX-License-Identifier: Apache-2.0
// The array conversions of tutti/half.h.
//
// Note [Converting arrays of halves]
// Compressed gradients (DDP's and DistributedOptimizer's compression, the fp16 and bf16 hooks,
// PowerSGD's wire) and the runtime's pack and unpack of Float16/BFloat16 tensors convert whole
// buffers between float and a 2-byte type. The element-wise float16 conversion is branchy
// scalar code, about 1 ns an element: the fp16 hook's step on the ResNet-50 gradients took 4x
// the plain allreduce's, most of it converting. x86's F16C instructions convert eight
// elements at once with the same rounding (IEEE round to nearest even, subnormals kept); they
// run where the CPU has them (a check at run time, so that the portable build uses them too).
// They differ from the scalar code only in NaN payloads, which are fixed up lane by lane, so
// that an array converts to exactly what its elements would. bfloat16's conversions are
// integer operations, eight at a time with AVX2 likewise. (No `#pragma GCC optimize`, which
// would leak into the files a unity build puts after this one.)

#include "tutti/half.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "tutti/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace tutti {
namespace {

void check_sizes(std::size_t from, std::size_t to) {
  if (from != to) {
    throw Error(ErrorCode::InvalidArgument, "tutti::convert: " + std::to_string(from) +
                                                " elements cannot go into " + std::to_string(to));
  }
}

#if defined(__x86_64__)

bool has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c"). With AVX2
// usable, the OS saves the YMM registers F16C works in.
bool has_f16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return has_avx2() && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  }();
  return has;
}

__attribute__((target("avx2,f16c"))) std::size_t to_half_f16c(const float* from, std::uint16_t* to,
                                                              std::size_t count) {
  const __m128i magnitude = _mm_set1_epi16(0x7fff);
  const __m128i infinity = _mm_set1_epi16(0x7c00);
  const __m128i sign = _mm_set1_epi16(static_cast<short>(0x8000));
  const __m128i quiet_nan = _mm_set1_epi16(0x7e00);
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT);
    // A NaN keeps its payload's top bits here; float16::from_float makes it sign | 0x7e00.
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, magnitude), infinity);
    h = _mm_blendv_epi8(h, _mm_or_si128(_mm_and_si128(h, sign), quiet_nan), nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i), h);
  }
  return i;
}

__attribute__((target("avx2,f16c"))) std::size_t to_float_f16c(const std::uint16_t* from, float* to,
                                                               std::size_t count) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fff);
  const __m256i infinity = _mm256_set1_epi32(0x7c00);
  const __m256i sign = _mm256_set1_epi32(0x8000);
  const __m256i mantissa = _mm256_set1_epi32(0x3ff);
  const __m256i float_infinity = _mm256_set1_epi32(0x7f800000);
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i));
    __m256 f = _mm256_cvtph_ps(h);
    // The instruction quiets a signaling NaN; float16::to_float keeps its payload as it is.
    const __m256i w = _mm256_cvtepu16_epi32(h);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, magnitude), infinity);
    const __m256i exact = _mm256_or_si256(
        _mm256_slli_epi32(_mm256_and_si256(w, sign), 16),
        _mm256_or_si256(float_infinity, _mm256_slli_epi32(_mm256_and_si256(w, mantissa), 13)));
    f = _mm256_blendv_ps(f, _mm256_castsi256_ps(exact), _mm256_castsi256_ps(nan));
    _mm256_storeu_ps(to + i, f);
  }
  return i;
}

__attribute__((target("avx2"))) std::size_t to_bfloat_avx2(const float* from, std::uint16_t* to,
                                                           std::size_t count) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i below_half = _mm256_set1_epi32(0x7fff);
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i infinity = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i));
    // bfloat16::from_float, lane by lane: round to nearest even; a NaN stays a quiet NaN.
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(w, 16), one);
    __m256i b = _mm256_srli_epi32(_mm256_add_epi32(w, _mm256_add_epi32(below_half, odd)), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, magnitude), infinity);
    b = _mm256_blendv_epi8(b, _mm256_or_si256(_mm256_srli_epi32(w, 16), quiet), nan);
    // Every lane is below 0x10000, so the saturating pack only narrows.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i), packed);
  }
  return i;
}

__attribute__((target("avx2"))) std::size_t to_float_from_bfloat_avx2(const std::uint16_t* from,
                                                                      float* to,
                                                                      std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  }
  return i;
}

#endif

}  // namespace

void convert(std::span<const float> from, std::span<float16> to) {
  check_sizes(from.size(), to.size());
  std::size_t i = 0;
#if defined(__x86_64__)
  static_assert(sizeof(float16) == sizeof(std::uint16_t));
  if (has_f16c())
    i = to_half_f16c(from.data(), reinterpret_cast<std::uint16_t*>(to.data()), from.size());
#endif
  for (; i < from.size(); ++i) to[i] = float16(from[i]);
}

void convert(std::span<const float16> from, std::span<float> to) {
  check_sizes(from.size(), to.size());
  std::size_t i = 0;
#if defined(__x86_64__)
  if (has_f16c())
    i = to_float_f16c(reinterpret_cast<const std::uint16_t*>(from.data()), to.data(), from.size());
#endif
  for (; i < from.size(); ++i) to[i] = static_cast<float>(from[i]);
}

void convert(std::span<const float> from, std::span<bfloat16> to) {
  check_sizes(from.size(), to.size());
  std::size_t i = 0;
#if defined(__x86_64__)
  static_assert(sizeof(bfloat16) == sizeof(std::uint16_t));
  if (has_avx2())
    i = to_bfloat_avx2(from.data(), reinterpret_cast<std::uint16_t*>(to.data()), from.size());
#endif
  for (; i < from.size(); ++i) to[i] = bfloat16(from[i]);
}

void convert(std::span<const bfloat16> from, std::span<float> to) {
  check_sizes(from.size(), to.size());
  std::size_t i = 0;
#if defined(__x86_64__)
  if (has_avx2()) {
    i = to_float_from_bfloat_avx2(reinterpret_cast<const std::uint16_t*>(from.data()), to.data(),
                                  from.size());
  }
#endif
  for (; i < from.size(); ++i) to[i] = static_cast<float>(from[i]);
}

}  // namespace tutti
