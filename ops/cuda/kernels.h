// SPDX-License-Identifier: Apache-2.0
// The CUDA kernels' C++17 interface: plain types only, so that ops/cuda/*.cc (C++20) and the
// kernels in ops/cuda/kernels.cu (nvcc, C++17) share it. Launchers return the cudaError_t as
// an int; the wrappers in ops/cuda/device_ops.cc turn it into a Status.
#pragma once

#include <cstddef>
#include <cstdint>

// The inline helpers below also run on the device when nvcc compiles them.
#if defined(__CUDACC__)
#define TUTTI_HOST_DEVICE_ __host__ __device__
#else
#define TUTTI_HOST_DEVICE_
#endif

namespace tutti::ops::cuda {

// Element types as the kernels see them: the numeric values of tutti::DataType (checked by
// static_asserts in ops/cuda/device_ops.cc).
enum class KernelType : std::uint8_t {
  UInt8,
  Int8,
  UInt16,
  Int16,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Bool
};

TUTTI_HOST_DEVICE_ inline constexpr std::size_t kernel_type_size(KernelType type) {
  switch (type) {
    case KernelType::UInt8:
    case KernelType::Int8:
    case KernelType::Bool: return 1;
    case KernelType::UInt16:
    case KernelType::Int16:
    case KernelType::Float16:
    case KernelType::BFloat16: return 2;
    case KernelType::Int32:
    case KernelType::Float32: return 4;
    case KernelType::Int64:
    case KernelType::Float64: return 8;
  }
  return 0;
}

// CopyDescriptor::flags. Integer-to-integer copies wrap (keep the low bits) instead of
// saturating; the factor is ignored. Used to narrow back what was widened for a reduction, so
// that 16-bit sums wrap as MPI's do.
inline constexpr std::uint8_t kCopyFlagModular = 1;

// One tensor of a batched copy:
//   destination[i] = DestinationType(source[i] * factor),  0 <= i < count
// computed in float when both types are Float16, BFloat16 or Float32, in double otherwise;
// conversion to an integer type truncates toward zero and saturates (NaN becomes 0); to Bool
// it tests for non-zero. Equal types with factor 1 copy the bytes. The results equal
// ops::cpu::convert_scale's bit for bit, except for NaN payloads. Source and destination
// either do not overlap or are the same address with the same element size (scaling in
// place).
struct CopyDescriptor {
  const void* source = nullptr;
  void* destination = nullptr;
  std::uint64_t count = 0;
  double factor = 1.0;
  std::uint64_t first_block = 0;  // Set by plan_batched_copy().
  KernelType source_type = KernelType::Float32;
  KernelType destination_type = KernelType::Float32;
  std::uint8_t flags = 0;
};

// The launch shape. A block copies one chunk of one tensor: kCopyThreadsPerBlock threads,
// each moving kCopyVectorsPerThread 16-byte vectors of the wider side, so a chunk is 16 KiB of
// the wider type: large enough that block scheduling is a small share of the time, small
// enough that the last wave of ResNet-50's 100 MB leaves few SMs idle.
inline constexpr int kCopyThreadsPerBlock = 256;
inline constexpr int kCopyVectorsPerThread = 4;
inline constexpr std::size_t kCopyVectorBytes = 16;
inline constexpr std::size_t kCopyChunkBytes =
    kCopyThreadsPerBlock * kCopyVectorsPerThread * kCopyVectorBytes;

// Elements of one tensor that one block handles.
TUTTI_HOST_DEVICE_ inline constexpr std::uint64_t copy_chunk_elements(const CopyDescriptor& copy) {
  const std::size_t source = kernel_type_size(copy.source_type);
  const std::size_t destination = kernel_type_size(copy.destination_type);
  return kCopyChunkBytes / (source > destination ? source : destination);
}

// Sets each descriptor's first_block (blocks are numbered tensor after tensor) and returns the
// number of blocks of the whole batch. Host code.
inline std::uint64_t plan_batched_copy(CopyDescriptor* copies, std::size_t count) {
  std::uint64_t blocks = 0;
  for (std::size_t i = 0; i < count; ++i) {
    copies[i].first_block = blocks;
    const std::uint64_t chunk = copy_chunk_elements(copies[i]);
    blocks += (copies[i].count + chunk - 1) / chunk;
  }
  return blocks;
}

struct BatchedCopyArgs {
  const CopyDescriptor* descriptors = nullptr;  // Device memory, planned, in block order.
  std::size_t descriptor_count = 0;
  std::uint64_t block_count = 0;  // plan_batched_copy()'s result.
};

// Enqueues every copy of `args` on `stream` (a cudaStream_t) as one kernel launch. The
// descriptor array must stay unchanged until the kernel has run. Returns a cudaError_t;
// cudaErrorInvalidValue if block_count exceeds the grid limit.
int launch_batched_copy_scale(const BatchedCopyArgs* args, void* stream);

}  // namespace tutti::ops::cuda
