// SPDX-License-Identifier: Apache-2.0
// The batched copy-and-scale kernel behind device fusion: one launch packs (or unpacks) many
// tensors, converting types and applying scale factors on the way (see ops/cuda/kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda_runtime.h>

#include "ops/cuda/kernels.h"

namespace tutti::ops::cuda {
namespace {

// Storage types of the 2-byte floats: the kernels move their bits and convert with the
// hardware's round-to-nearest-even instructions.
struct Half {
  unsigned short bits;
};
struct BHalf {
  unsigned short bits;
};

template <class T>
struct IsNarrowFloat {
  static constexpr bool value = false;
};
template <>
struct IsNarrowFloat<float> {
  static constexpr bool value = true;
};
template <>
struct IsNarrowFloat<Half> {
  static constexpr bool value = true;
};
template <>
struct IsNarrowFloat<BHalf> {
  static constexpr bool value = true;
};

template <class T>
struct IsInteger {
  static constexpr bool value = false;
};
template <>
struct IsInteger<unsigned char> {
  static constexpr bool value = true;
};
template <>
struct IsInteger<signed char> {
  static constexpr bool value = true;
};
template <>
struct IsInteger<unsigned short> {
  static constexpr bool value = true;
};
template <>
struct IsInteger<short> {
  static constexpr bool value = true;
};
template <>
struct IsInteger<int> {
  static constexpr bool value = true;
};
template <>
struct IsInteger<long long> {
  static constexpr bool value = true;
};

// Integer limits (the CPU path's std::numeric_limits).
template <class T>
struct Limits;
template <>
struct Limits<unsigned char> {
  static constexpr unsigned char kMax = 255, kLowest = 0;
};
template <>
struct Limits<signed char> {
  static constexpr signed char kMax = 127, kLowest = -128;
};
template <>
struct Limits<unsigned short> {
  static constexpr unsigned short kMax = 65535, kLowest = 0;
};
template <>
struct Limits<short> {
  static constexpr short kMax = 32767, kLowest = -32768;
};
template <>
struct Limits<int> {
  static constexpr int kMax = 2147483647, kLowest = -2147483647 - 1;
};
template <>
struct Limits<long long> {
  static constexpr long long kMax = 9223372036854775807LL, kLowest = -9223372036854775807LL - 1;
};

template <class C, class S>
__device__ __forceinline__ C widen(S value) {
  return static_cast<C>(value);
}
template <class C>
__device__ __forceinline__ C widen(Half value) {
  return static_cast<C>(__half2float(__ushort_as_half(value.bits)));
}
template <class C>
__device__ __forceinline__ C widen(BHalf value) {
  return static_cast<C>(__bfloat162float(__ushort_as_bfloat16(value.bits)));
}

template <class D>
struct Narrow {
  template <class C>
  __device__ __forceinline__ static D from(C value) {
    if constexpr (IsInteger<D>::value) {
      // Saturate instead of undefined behaviour; NaN becomes 0; truncate toward zero.
      if (!(value == value)) return D(0);
      // As on the CPU, the limits are compared as the compute type: int64's maximum as 2^63.
      if (value >= static_cast<C>(Limits<D>::kMax)) return Limits<D>::kMax;
      if (value <= static_cast<C>(Limits<D>::kLowest)) return Limits<D>::kLowest;
      return static_cast<D>(value);
    } else {
      return static_cast<D>(value);
    }
  }
};
template <>
struct Narrow<bool> {
  template <class C>
  __device__ __forceinline__ static bool from(C value) {
    return value != C(0);
  }
};
template <>
struct Narrow<Half> {
  template <class C>
  __device__ __forceinline__ static Half from(C value) {
    // Through float, as tutti::float16(float) on the CPU path.
    return Half{__half_as_ushort(__float2half_rn(static_cast<float>(value)))};
  }
};
template <>
struct Narrow<BHalf> {
  template <class C>
  __device__ __forceinline__ static BHalf from(C value) {
    return BHalf{__bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(value)))};
  }
};

// One element: float arithmetic where both sides fit in float (API.md: half types are reduced
// in float32), double otherwise, as ops::cpu::convert_scale.
template <class S, class D, bool kModular>
__device__ __forceinline__ D convert(S value, double factor) {
  if constexpr (kModular && IsInteger<S>::value && IsInteger<D>::value) {
    return static_cast<D>(static_cast<unsigned long long>(static_cast<long long>(value)));
  } else if constexpr (IsNarrowFloat<S>::value && IsNarrowFloat<D>::value) {
    const float x = widen<float>(value);
    return Narrow<D>::from(x * static_cast<float>(factor));
  } else {
    const double x = widen<double>(value);
    return Narrow<D>::from(x * factor);
  }
}

// Raw vector registers: 1..16 bytes as one access, 32 and 64 bytes as two and four 16-byte
// accesses (the wider side of a conversion whose narrower side moves 16 bytes).
template <int kBytes>
struct Raw;
struct alignas(16) Vector32 {
  uint4 part[2];
};
struct alignas(16) Vector64 {
  uint4 part[4];
};
struct alignas(16) Vector128 {
  uint4 part[8];
};
template <>
struct Raw<128> {
  using Type = Vector128;
};
template <>
struct Raw<64> {
  using Type = Vector64;
};
template <>
struct Raw<32> {
  using Type = Vector32;
};
template <>
struct Raw<16> {
  using Type = uint4;
};
template <>
struct Raw<8> {
  using Type = uint2;
};
template <>
struct Raw<4> {
  using Type = unsigned int;
};
template <>
struct Raw<2> {
  using Type = unsigned short;
};
template <>
struct Raw<1> {
  using Type = unsigned char;
};

template <class T, int kCount>
union Pack {
  typename Raw<static_cast<int>(sizeof(T)) * kCount>::Type raw;
  T values[kCount];
};

__device__ __forceinline__ bool aligned(const void* pointer, unsigned long long bytes) {
  return reinterpret_cast<unsigned long long>(pointer) % bytes == 0;
}

// Copies bytes [begin, end) of one tensor in kWidth-byte words; both sides are kWidth-aligned
// at `begin` (a unit boundary, a multiple of 16 bytes into the tensor).
template <int kWidth>
__device__ void copy_words(const unsigned char* source, unsigned char* destination,
                           unsigned long long begin, unsigned long long end) {
  using Word = typename Raw<kWidth>::Type;
  const Word* in = reinterpret_cast<const Word*>(source + begin);
  Word* out = reinterpret_cast<Word*>(destination + begin);
  const unsigned long long words = (end - begin) / kWidth;
  const unsigned long long stride = blockDim.x;
  unsigned long long i = threadIdx.x;
  // Loads first, then stores: kCopyVectorsPerThread independent loads in flight per thread.
  for (; i + (kCopyVectorsPerThread - 1) * stride < words; i += kCopyVectorsPerThread * stride) {
    Word buffer[kCopyVectorsPerThread];
#pragma unroll
    for (int k = 0; k < kCopyVectorsPerThread; ++k) buffer[k] = in[i + k * stride];
#pragma unroll
    for (int k = 0; k < kCopyVectorsPerThread; ++k) out[i + k * stride] = buffer[k];
  }
  for (; i < words; i += stride) out[i] = in[i];
  for (unsigned long long b = begin + words * kWidth + threadIdx.x; b < end; b += stride) {
    destination[b] = source[b];
  }
}

__device__ void copy_bytes(const void* source, void* destination, unsigned long long begin,
                           unsigned long long end) {
  const auto* in = static_cast<const unsigned char*>(source);
  auto* out = static_cast<unsigned char*>(destination);
  // The widest word both sides are aligned to.
  const unsigned long long misalignment = reinterpret_cast<unsigned long long>(in + begin) |
                                          reinterpret_cast<unsigned long long>(out + begin);
  if (misalignment % 16 == 0) return copy_words<16>(in, out, begin, end);
  if (misalignment % 8 == 0) return copy_words<8>(in, out, begin, end);
  if (misalignment % 4 == 0) return copy_words<4>(in, out, begin, end);
  if (misalignment % 2 == 0) return copy_words<2>(in, out, begin, end);
  copy_words<1>(in, out, begin, end);
}

// Converts elements [begin, end) of one tensor. A vector is 16 bytes of the narrower type
// (kVector elements) and the matching bytes of the wider one, when both sides are 16-byte
// aligned; each thread keeps 64 bytes of the wider side in flight (fewer vectors the wider
// the ratio). Single elements otherwise and for the tail.
template <class S, class D, bool kModular>
__device__ void convert_range(const CopyDescriptor& copy, unsigned long long begin,
                              unsigned long long end) {
  constexpr int kNarrower =
      sizeof(S) < sizeof(D) ? static_cast<int>(sizeof(S)) : static_cast<int>(sizeof(D));
  constexpr int kWider =
      sizeof(S) > sizeof(D) ? static_cast<int>(sizeof(S)) : static_cast<int>(sizeof(D));
  constexpr int kVector = static_cast<int>(kCopyVectorBytes) / kNarrower;
  constexpr int kRatio = kWider / kNarrower;
  constexpr int kDepth = kCopyVectorsPerThread / kRatio > 0 ? kCopyVectorsPerThread / kRatio : 1;
  const S* source = static_cast<const S*>(copy.source) + begin;
  D* destination = static_cast<D*>(copy.destination) + begin;
  const double factor = copy.factor;
  const unsigned long long count = end - begin;
  const unsigned long long stride = blockDim.x;
  unsigned long long done = 0;
  if (aligned(source, kCopyVectorBytes) && aligned(destination, kCopyVectorBytes)) {
    using In = Pack<S, kVector>;
    using Out = Pack<D, kVector>;
    const auto* in = reinterpret_cast<const decltype(In::raw)*>(source);
    auto* out = reinterpret_cast<decltype(Out::raw)*>(destination);
    const unsigned long long vectors = count / kVector;
    unsigned long long i = threadIdx.x;
    for (; i + (kDepth - 1) * stride < vectors; i += kDepth * stride) {
      In buffer[kDepth];
#pragma unroll
      for (int k = 0; k < kDepth; ++k) buffer[k].raw = in[i + k * stride];
#pragma unroll
      for (int k = 0; k < kDepth; ++k) {
        Out result;
#pragma unroll
        for (int e = 0; e < kVector; ++e) {
          result.values[e] = convert<S, D, kModular>(buffer[k].values[e], factor);
        }
        out[i + k * stride] = result.raw;
      }
    }
    for (; i < vectors; i += stride) {
      In value;
      value.raw = in[i];
      Out result;
#pragma unroll
      for (int e = 0; e < kVector; ++e) {
        result.values[e] = convert<S, D, kModular>(value.values[e], factor);
      }
      out[i] = result.raw;
    }
    done = vectors * kVector;
  }
  for (unsigned long long i = done + threadIdx.x; i < count; i += stride) {
    destination[i] = convert<S, D, kModular>(source[i], factor);
  }
}

// Multiplying by a factor of 1 changes no value, so unscaled conversions share the scaled
// code; only integer pairs get a modular variant. Each variant is one more instantiation of
// 121 type pairs, and nvcc's time grows with them.
template <class S, class D>
__device__ void convert_dispatch_flags(const CopyDescriptor& copy, unsigned long long begin,
                                       unsigned long long end) {
  if constexpr (IsInteger<S>::value && IsInteger<D>::value) {
    if ((copy.flags & kCopyFlagModular) != 0) return convert_range<S, D, true>(copy, begin, end);
  }
  convert_range<S, D, false>(copy, begin, end);
}

template <class S>
__device__ void convert_dispatch_destination(const CopyDescriptor& copy, unsigned long long begin,
                                             unsigned long long end) {
  switch (copy.destination_type) {
    case KernelType::UInt8: return convert_dispatch_flags<S, unsigned char>(copy, begin, end);
    case KernelType::Int8: return convert_dispatch_flags<S, signed char>(copy, begin, end);
    case KernelType::UInt16: return convert_dispatch_flags<S, unsigned short>(copy, begin, end);
    case KernelType::Int16: return convert_dispatch_flags<S, short>(copy, begin, end);
    case KernelType::Int32: return convert_dispatch_flags<S, int>(copy, begin, end);
    case KernelType::Int64: return convert_dispatch_flags<S, long long>(copy, begin, end);
    case KernelType::Float16: return convert_dispatch_flags<S, Half>(copy, begin, end);
    case KernelType::BFloat16: return convert_dispatch_flags<S, BHalf>(copy, begin, end);
    case KernelType::Float32: return convert_dispatch_flags<S, float>(copy, begin, end);
    case KernelType::Float64: return convert_dispatch_flags<S, double>(copy, begin, end);
    case KernelType::Bool: return convert_dispatch_flags<S, bool>(copy, begin, end);
  }
}

__device__ void convert_dispatch(const CopyDescriptor& copy, unsigned long long begin,
                                 unsigned long long end) {
  switch (copy.source_type) {
    case KernelType::UInt8: return convert_dispatch_destination<unsigned char>(copy, begin, end);
    case KernelType::Int8: return convert_dispatch_destination<signed char>(copy, begin, end);
    case KernelType::UInt16: return convert_dispatch_destination<unsigned short>(copy, begin, end);
    case KernelType::Int16: return convert_dispatch_destination<short>(copy, begin, end);
    case KernelType::Int32: return convert_dispatch_destination<int>(copy, begin, end);
    case KernelType::Int64: return convert_dispatch_destination<long long>(copy, begin, end);
    case KernelType::Float16: return convert_dispatch_destination<Half>(copy, begin, end);
    case KernelType::BFloat16: return convert_dispatch_destination<BHalf>(copy, begin, end);
    case KernelType::Float32: return convert_dispatch_destination<float>(copy, begin, end);
    case KernelType::Float64: return convert_dispatch_destination<double>(copy, begin, end);
    case KernelType::Bool: return convert_dispatch_destination<bool>(copy, begin, end);
  }
}

// One block's share of the batch (Note [Batched copy launch] in kernels.h): the pieces of the
// copies its units overlap, one after another.
__global__ void __launch_bounds__(kCopyThreadsPerBlock)
    batched_copy_scale(const CopyDescriptor* __restrict__ copies, unsigned long long count,
                       unsigned long long units) {
  for_each_block_range(copies, count, units, blockIdx.x, gridDim.x,
                       [copies](std::uint64_t index, std::uint64_t begin, std::uint64_t end) {
                         const CopyDescriptor copy = copies[index];
                         if (copy.source_type == copy.destination_type &&
                             ((copy.flags & kCopyFlagModular) != 0 || copy.factor == 1.0)) {
                           const unsigned long long size = kernel_type_size(copy.source_type);
                           copy_bytes(copy.source, copy.destination, begin * size, end * size);
                         } else {
                           convert_dispatch(copy, begin, end);
                         }
                       });
}

}  // namespace

int launch_batched_copy_scale(const BatchedCopyArgs* args, void* stream) {
  if (args->unit_count == 0) return cudaSuccess;
  if (args->block_count == 0 || args->block_count > 0x7fffffffull) return cudaErrorInvalidValue;
  const unsigned long long blocks =
      args->block_count < args->unit_count ? args->block_count : args->unit_count;
  batched_copy_scale<<<static_cast<unsigned int>(blocks), kCopyThreadsPerBlock, 0,
                       static_cast<cudaStream_t>(stream)>>>(
      args->descriptors, static_cast<unsigned long long>(args->descriptor_count),
      static_cast<unsigned long long>(args->unit_count));
  return cudaGetLastError();
}

int batched_copy_resident_blocks(int device, std::uint64_t* blocks) {
  int processors = 0;
  cudaError_t code = cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device);
  if (code != cudaSuccess) return code;
  int per_processor = 0;
  // Occupancy is a property of the current device: the caller has made `device` current.
  code = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_processor, batched_copy_scale,
                                                       kCopyThreadsPerBlock, 0);
  if (code != cudaSuccess) return code;
  *blocks = static_cast<std::uint64_t>(processors) *
            static_cast<std::uint64_t>(per_processor > 0 ? per_processor : 1);
  return cudaSuccess;
}

}  // namespace tutti::ops::cuda
