// SPDX-License-Identifier: Apache-2.0
// D1's reference where every rank has a GPU of its own (one rank included): what a hand-written
// fused NCCL step costs on the same gradients, so that Tutti's D1 time has something real to be
// compared with (DESIGN.md section 6: D1 <= 1.1x this). CUDA builds with NCCL only
// (TUTTI_BENCHMARK_NCCL); allreduce_benchmark --device cuda prints it.
#pragma once

#include <cstdint>
#include <vector>

namespace tutti::examples {

// One fused step on the GPU, in milliseconds, each part timed with CUDA events.
struct FusedNcclFigures {
  double pack_ms = 0;       // Tutti's batched copy kernel: every gradient into one buffer.
  double allreduce_ms = 0;  // One ncclAllReduce (Sum) of the fused buffer.
  double unpack_ms = 0;     // The kernel back into the gradients, scaled by 1/size (Average).
  double total_ms = 0;      // From before the pack to after the unpack.
};

// Float32 gradients of `counts` elements on cuda:`device` (tensors at 256-byte aligned offsets,
// slots of the fused buffer at 16-byte aligned ones, as core packs), on one non-blocking
// stream: the best total of `repeats` steps after one warm-up, each step started after an
// MPI_Barrier, the slowest rank's time. Collective over MPI_COMM_WORLD (an NCCL communicator
// of the world is made and destroyed here); every rank needs a GPU of its own. Run it while
// Tutti is shut down or idle. Throws std::runtime_error naming a failed CUDA or NCCL call.
FusedNcclFigures fused_nccl_reference(const std::vector<std::int64_t>& counts, int device,
                                      int repeats);

}  // namespace tutti::examples
