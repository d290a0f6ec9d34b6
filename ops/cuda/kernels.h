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
  std::uint64_t first_unit = 0;  // Set by plan_batched_copy().
  KernelType source_type = KernelType::Float32;
  KernelType destination_type = KernelType::Float32;
  std::uint8_t flags = 0;
};

// Note [Batched copy launch]
// The work is split by bytes, not by tensor, so that ResNet-50's 161 gradients (64 floats to
// 2.4 M) keep every SM streaming:
//   1. Each copy is cut into units of kCopyUnitBytes of its wider side (one 16-byte vector per
//      thread of a block), numbered copy after copy: plan_batched_copy() sets first_unit.
//   2. A launch has at most as many blocks as the device keeps resident at once (SMs times
//      blocks per SM: batched_copy_resident_blocks()), so all run in one wave. Block b takes
//      the contiguous units [b*U/B, (b+1)*U/B) of the U units (block_units()), across copy
//      boundaries: equal shares of bytes, whatever the tensors' sizes.
//   3. Within its share a block walks the copies it overlaps (for_each_block_range()) and moves
//      each piece with 16-byte loads and stores, kCopyVectorsPerThread of them in flight per
//      thread; a conversion reads 16 bytes of the narrower type per vector and writes the
//      matching 16-byte vectors of the wider one. Pointers not 16-byte aligned take narrower
//      words (plain copies) or single elements (conversions).
// The index arithmetic below is plain C++ shared by the kernel and a CPU test
// (test/unit/core/batched_copy_plan_test.cc), which checks that every element of every copy
// is covered exactly once for any block count.
inline constexpr int kCopyThreadsPerBlock = 256;
inline constexpr int kCopyVectorsPerThread = 4;
inline constexpr std::size_t kCopyVectorBytes = 16;
inline constexpr std::size_t kCopyUnitBytes = kCopyThreadsPerBlock * kCopyVectorBytes;

// Elements of one copy in one unit: 4 KiB of its wider type.
TUTTI_HOST_DEVICE_ inline constexpr std::uint64_t copy_unit_elements(const CopyDescriptor& copy) {
  const std::size_t source = kernel_type_size(copy.source_type);
  const std::size_t destination = kernel_type_size(copy.destination_type);
  return kCopyUnitBytes / (source > destination ? source : destination);
}

// Sets each descriptor's first_unit and returns the number of units of the whole batch.
// Host code.
inline std::uint64_t plan_batched_copy(CopyDescriptor* copies, std::size_t count) {
  std::uint64_t units = 0;
  for (std::size_t i = 0; i < count; ++i) {
    copies[i].first_unit = units;
    const std::uint64_t per_unit = copy_unit_elements(copies[i]);
    units += (copies[i].count + per_unit - 1) / per_unit;
  }
  return units;
}

// The units [begin, end) of block `block` of `blocks` for a batch of `units` units: equal
// shares, the first units % blocks blocks one unit more. No overflow for any 64-bit counts.
struct UnitRange {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};
TUTTI_HOST_DEVICE_ inline UnitRange block_units(std::uint64_t block, std::uint64_t blocks,
                                                std::uint64_t units) {
  const std::uint64_t share = units / blocks;
  const std::uint64_t extra = units % blocks;
  const std::uint64_t begin = block * share + (block < extra ? block : extra);
  return UnitRange{begin, begin + share + (block < extra ? 1 : 0)};
}

// Calls visit(index, first_element, end_element) for every copy piece of block `block`, in
// copy order: elements [first_element, end_element) of copies[index], never empty.
// `copies` are planned (plan_batched_copy) with `units` in all.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable  // `visit` is device code in the kernel, host code in the test.
#endif
template <class Visit>
TUTTI_HOST_DEVICE_ inline void for_each_block_range(const CopyDescriptor* copies,
                                                    std::uint64_t count, std::uint64_t units,
                                                    std::uint64_t block, std::uint64_t blocks,
                                                    Visit&& visit) {
  const UnitRange mine = block_units(block, blocks, units);
  if (mine.begin >= mine.end || count == 0) return;
  // The last copy whose first unit is at or before the share's first: it holds that unit
  // (copies without elements own no unit, so the last of equal first_units is the one).
  std::uint64_t low = 0;
  std::uint64_t high = count;  // Invariant: copies[low].first_unit <= mine.begin.
  while (high - low > 1) {
    const std::uint64_t middle = low + (high - low) / 2;
    if (copies[middle].first_unit <= mine.begin) {
      low = middle;
    } else {
      high = middle;
    }
  }
  for (std::uint64_t index = low; index < count; ++index) {
    const std::uint64_t first_unit = copies[index].first_unit;
    if (first_unit >= mine.end) break;
    const std::uint64_t per_unit = copy_unit_elements(copies[index]);
    const std::uint64_t count_here = copies[index].count;
    const std::uint64_t copy_units = (count_here + per_unit - 1) / per_unit;
    const std::uint64_t skipped = mine.begin > first_unit ? mine.begin - first_unit : 0;
    const std::uint64_t last = mine.end - first_unit;
    const std::uint64_t from = skipped * per_unit;
    const std::uint64_t to = last >= copy_units ? count_here : last * per_unit;
    if (from < to) visit(index, from, to);
  }
}

struct BatchedCopyArgs {
  const CopyDescriptor* descriptors = nullptr;  // Device memory, planned, in unit order.
  std::size_t descriptor_count = 0;
  std::uint64_t unit_count = 0;   // plan_batched_copy()'s result.
  std::uint64_t block_count = 0;  // 1 .. batched_copy_resident_blocks(); at most unit_count.
};

// Enqueues every copy of `args` on `stream` (a cudaStream_t) as one kernel launch. The
// descriptor array must stay unchanged until the kernel has run. Returns a cudaError_t;
// cudaErrorInvalidValue if block_count is 0 for a batch with units or exceeds the grid limit.
int launch_batched_copy_scale(const BatchedCopyArgs* args, void* stream);

// How many blocks of the batched copy kernel cuda:`device` keeps resident at once (SMs times
// blocks per SM), into *blocks. Returns a cudaError_t. Any thread.
int batched_copy_resident_blocks(int device, std::uint64_t* blocks);

}  // namespace tutti::ops::cuda
