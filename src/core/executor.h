// SPDX-License-Identifier: Apache-2.0
// Runs negotiated ops on this rank: fusion pack, the backend collective, unpack, outputs.
// Communication thread only.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "ops/backend.h"
#include "src/common/status.h"
#include "src/core/fusion_buffer.h"
#include "src/core/request.h"
#include "src/core/tensor_queue.h"

namespace tutti::core {

// One negotiated op and this rank's submission of it.
struct Work {
  const Response* response = nullptr;
  std::shared_ptr<Entry> entry;
};

// The dtype an allreduce travels in: float32 for float16/bfloat16, float64 for integers that
// are averaged or scaled (API.md: computed in double, then truncated), else its own.
DataType wire_dtype(DataType dtype, ReduceOp op, double prescale, double postscale);
ops::WireOp wire_op(ReduceOp op);

class Executor {
 public:
  // `chunk_bytes`: the piece size for a tensor reduced in place (0 = whole).
  explicit Executor(std::size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

  // Allreduces of one fusion batch (same set, wire dtype, wire op).
  Status allreduce(std::span<Work> batch, ops::Backend& backend);
  Status broadcast(Work& work, ops::Backend& backend, int root_set_rank);
  Status allgather(Work& work, ops::Backend& backend);
  Status alltoall(Work& work, ops::Backend& backend);
  Status reducescatter(Work& work, ops::Backend& backend);

  void set_chunk_bytes(std::size_t bytes) { chunk_bytes_ = bytes; }

 private:
  Status allreduce_in_place(Work& work, ops::Backend& backend);

  std::size_t chunk_bytes_;
  FusionBuffer buffer_;
};

}  // namespace tutti::core
