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
#include <optional>
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
  // One pass of Note [Mixed wire dtypes]: the tensors that travel in `wire` (`only`), or all.
  Status allreduce_pass(std::span<Work> batch, DataType wire, std::size_t total,
                        std::optional<DataType> only, ops::Backend& backend, Mover& mover);
  Status allreduce_tensors(std::span<Work> batch, DataType wire, std::optional<DataType> only,
                           ops::Backend& backend);
  Status reduce_pass(std::span<Work> batch, DataType wire, std::size_t total,
                     std::optional<DataType> only, ops::Backend& backend, Mover& mover,
                     int root_set_rank);
  Status adasum(std::span<Work> batch, ops::Backend& backend, Mover& mover);
  Status adasum_in_place(Work& work, ops::Backend& backend, Mover& mover);
  Status reduce_in_place(Work& work, ops::Backend& backend, Mover& mover, int root);
  Status gather_one(Work& work, ops::Backend& backend, Mover& mover, int root);

  Timeline* timeline_ = nullptr;
};

// Note [Mixed wire dtypes]
// A grouped op may mix dtypes, and fusion keys only a response's first tensor, so a batch of
// reductions may hold tensors of several wire dtypes. Such a batch runs once per wire dtype,
// each pass over that dtype's tensors only, so that every tensor is reduced as it would be
// alone: one float64 pass for all (as before) was not exact for an int64 beyond 2^53, which
// API.md promises for unscaled integers, and made a tensor's result depend on its company.
// Adasum, floating only, still takes float64 for a mix (its coefficients span the batch).

// The wire dtype of every tensor of `batch` if they agree (else `mixed`, and the first one's),
// and the element count of the tensors of that wire dtype; one pass over the batch, the
// common case (P3 has batches of 10,000 tiny tensors).
struct WireBatch {
  DataType wire;
  std::size_t count = 0;
  bool mixed = false;
};
WireBatch wire_batch(std::span<const Work> batch);
// The wire dtypes of a mixed batch, in the order its tensors first use them (the same on
// every rank: the responses are).
std::vector<DataType> wire_dtypes(std::span<const Work> batch);
// Elements of the tensors of `batch` whose wire dtype is `wire`.
std::size_t wire_count(std::span<const Work> batch, DataType wire);
// Whether tensor `t` of `response` travels in `only` (every tensor does where `only` is empty).
inline bool travels_in(const Response& response, std::size_t t, std::optional<DataType> only) {
  return !only || wire_dtype(response.tensors[t].dtype, response.reduce_op, response.prescale,
                             response.postscale) == *only;
}
// The factor unpack applies: postscale, and 1/size for Average.
double output_factor(const Response& response, int size);

}  // namespace tutti::core
