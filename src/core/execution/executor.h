// SPDX-License-Identifier: Apache-2.0
// Runs negotiated ops on this rank: fusion pack, the backend collective, unpack, outputs.
// Communication thread only. executor.cc holds allreduce (with Adasum), reduce and broadcast,
// executor_gather.cc allgather, gather, alltoall and scatter, executor_reducescatter.cc
// reducescatter.
//
// The same code runs CPU and CUDA tensors: data moves through a Mover (host memory, or a
// device stream where copies become one batched kernel launch) and the collective through
// the backend of that memory. On a device each call returns with the work enqueued on the
// mover's stream; the caller completes the ops once an event after it has completed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ops/backend.h"
#include "src/base/dtype.h"
#include "src/base/shape.h"
#include "src/common/status.h"
#include "src/core/execution/mover.h"
#include "src/core/request.h"
#include "src/core/tensor_queue.h"
#include "src/core/timeline.h"

namespace tutti::core {

// One negotiated op and this rank's submission of it. `entry` is null on a member that has
// joined without submitting the op: it takes part in the collective with no data of its own
// (zeros, no rows, a scratch receive buffer; see Note [Join] in negotiation/coordinator.h).
struct Work {
  const Response* response = nullptr;
  std::shared_ptr<Entry> entry;
  // fusion_key() and fusion_bytes() of `response` (bytes SIZE_MAX for key 0: never fused),
  // derived once per cached response (ResponseFacts in response_cache.h).
  std::uint64_t fusion_key = 0;
  std::size_t fusion_bytes = 0;
};

// The dtype an allreduce travels in: float32 for float16/bfloat16, float64 for integers that
// are averaged or scaled (API.md: computed in double, then truncated), else its own.
// Inline: fusion asks it for every tensor of every batch.
inline DataType wire_dtype(DataType dtype, ReduceOp op, double prescale, double postscale) {
  if (dtype == DataType::Float16 || dtype == DataType::BFloat16) return DataType::Float32;
  const bool integer = !detail::floating(dtype) && dtype != DataType::Bool;
  const bool scaled = op == ReduceOp::Average || prescale != 1.0 || postscale != 1.0;
  return integer && scaled ? DataType::Float64 : dtype;
}
ops::WireOp wire_op(ReduceOp op);

// Which responses may fuse (equal non-zero keys; see Note [Fusion rules]) and how many bytes
// each adds to a batch. Functions of the response alone, so equal on every rank.
std::uint64_t fusion_key(const Response& response);
std::size_t fusion_bytes(const Response& response);

// Elements of one tensor, and of one row (the dims after the first; 1 for a 1-d tensor).
inline std::size_t count_of(const TensorSpec& spec) {
  return static_cast<std::size_t>(detail::num_elements(spec.shape));
}
inline std::size_t row_count(const TensorSpec& spec) {
  std::size_t count = 1;
  for (std::size_t d = 1; d < spec.shape.size(); ++d)
    count *= static_cast<std::size_t>(spec.shape[d]);
  return count;
}

// A copy of `count` elements, converting and scaling (see ops::CopySpec).
inline ops::CopySpec copy_of(void* destination, DataType destination_type, const void* source,
                             DataType source_type, std::size_t count, double factor) {
  return ops::CopySpec{.destination = destination,
                       .destination_type = destination_type,
                       .source = source,
                       .source_type = source_type,
                       .count = count,
                       .factor = factor};
}

class Executor {
 public:
  // Allreduces of one fusion batch (same set, device, wire dtype, wire op; or all Adasum).
  Status allreduce(std::span<Work> batch, ops::Backend& backend, Mover& mover);
  Status broadcast(Work& work, ops::Backend& backend, Mover& mover, int root_set_rank);
  // Allgathers of one fusion batch (same set, device and dtype of the first tensor).
  Status allgather(std::span<Work> batch, ops::Backend& backend, Mover& mover) {
    return gather(batch, backend, mover, -1);
  }
  Status alltoall(Work& work, ops::Backend& backend, Mover& mover);
  // The rooted ops (`root_set_rank` receives, or sends a scatter's parts). Reduces of one
  // fusion batch (as allreduce's, and the same root): only the root's tensors change.
  Status reduce(std::span<Work> batch, ops::Backend& backend, Mover& mover, int root_set_rank);
  // Gathers of one fusion batch (as allgather's, and the same root), or with root -1 an
  // allgather: the root's outputs hold every rank's rows, the others' stay empty.
  Status gather(std::span<Work> batch, ops::Backend& backend, Mover& mover, int root_set_rank);
  // The root's rows, response->splits[i] to set rank i: every member's output.
  Status scatter(Work& work, ops::Backend& backend, Mover& mover, int root_set_rank);
  // Reducescatters of one fusion batch (same set, device, wire dtype and op).
  Status reducescatter(std::span<Work> batch, ops::Backend& backend, Mover& mover);

  // Records each op's activities (pack, collective, unpack) into `timeline`, which must
  // outlive the executor. Null = none.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }
  // Starts `activity` on the timeline for every op of `batch` that this rank submitted.
  void mark(std::span<Work> batch, std::string_view activity) const;

 private:
  Status allreduce_in_place(Work& work, ops::Backend& backend, Mover& mover);
  Status allreduce_tensors(std::span<Work> batch, DataType wire, ops::Backend& backend);
  Status adasum(std::span<Work> batch, ops::Backend& backend, Mover& mover);
  Status adasum_in_place(Work& work, ops::Backend& backend, Mover& mover);
  Status reduce_in_place(Work& work, ops::Backend& backend, Mover& mover, int root);
  Status gather_one(Work& work, ops::Backend& backend, Mover& mover, int root);

  Timeline* timeline_ = nullptr;
};

// The dtype a whole batch of reductions travels in: the wire dtype of every tensor if they
// agree, else float64 (a grouped op may mix dtypes; float64 holds them all).
DataType batch_wire_dtype(std::span<const Work> batch);
// batch_wire_dtype() and the batch's element count, from one pass over it.
struct WireBatch {
  DataType wire;
  std::size_t count = 0;
};
WireBatch wire_batch(std::span<const Work> batch);
// The factor unpack applies: postscale, and 1/size for Average.
double output_factor(const Response& response, int size);

}  // namespace tutti::core
