// SPDX-License-Identifier: Apache-2.0
// Device fusion speed, shared by allreduce_benchmark --device cuda (figure D2) and
// cuda_fusion_benchmark: Tutti's batched copy kernel packing a gradient set into one fused
// buffer and unpacking it, against cudaMemcpyAsync device-to-device of the same bytes.
// CUDA builds only: it drives ops::DeviceOps (the seam core uses) directly, to time the kernel
// alone, so its binaries link tutti_core rather than the public library.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tutti::examples {

// One line of the table: what was timed, and how long one run of it took.
struct KernelFigure {
  std::string name;
  double seconds = 0;  // Per run, host launch cost included (what a fusion cycle pays).
  double bytes = 0;    // Float32 bytes read and written once each (the fused buffer's side).
};

struct FusionKernelFigures {
  std::string device_name;  // cudaDeviceProp::name.
  int device = 0;
  std::size_t tensors = 0;
  std::size_t elements = 0;
  int repeats = 0;
  // One cudaMemcpyAsync D2D of all the bytes: the reference every ratio divides by.
  double memcpy_seconds = 0;
  // The two memcpy references (one call, one per tensor), then the kernel's pack and unpack:
  // float32 plain, unpack scaled by 1/2, float16 and bfloat16 <-> float32 scaled by 1/2.
  std::vector<KernelFigure> rows;
};

// Times each row of FusionKernelFigures on cuda:`device` for tensors of `counts` elements
// (laid out at 256-byte aligned offsets, as cudaMalloc places them; the fused buffer at 16-byte
// aligned offsets, as core packs): 3 warm-up runs, then the mean of `repeats` runs enqueued
// back to back. Then checks that a pack (x2) and unpack (x1/2) round trip gives every tensor
// back bit for bit, since the figures mean nothing if the kernel is wrong.
// Local, blocking; sets the calling thread's current device. Needs a visible device (check
// ops::device_ops().device_count() first). Throws std::runtime_error naming the failing call,
// or the tensor the round trip changed.
FusionKernelFigures measure_fusion_kernel(const std::vector<std::size_t>& counts, int device,
                                          int repeats);

// Prints `figures` to stdout as a table: ms, GB/s and the ratio to the one-call memcpy
// (target for pack and unpack: >= 0.9x).
void print_fusion_kernel_figures(const FusionKernelFigures& figures);

}  // namespace tutti::examples
