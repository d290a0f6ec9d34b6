// SPDX-License-Identifier: Apache-2.0
// What ranks tell the coordinator (Request) and what it answers (Response). Plain data: the
// message codec turns lists of them into bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/inline_string.h"
#include "src/base/inline_vector.h"
#include "tutti/collectives.h"
#include "tutti/error.h"
#include "tutti/tensor.h"

namespace tutti::core {

enum class Collective : std::uint8_t {
  Allreduce,
  Allgather,
  Broadcast,
  Alltoall,
  Reducescatter,
  Barrier,
  Join,
  // Process-set changes, negotiated on the global set so that every rank creates or frees
  // the set's communicator at the same point of the response order.
  AddProcessSet,
  RemoveProcessSet,
  // Rooted collectives (API.md "Rooted collectives"): only the root receives a reduction or
  // the gathered rows, only the root sends a scatter's parts. Request::root_rank names it.
  Reduce,
  Gather,
  Scatter,
};
inline constexpr int kCollectiveCount = 12;

// The name join() submits under in its set (one join per rank and set is in flight at a time).
// Like "tutti.process_set.<n>" (see negotiation/coordinator.h), it is reserved: a user op of that
// name would be taken for a join.
inline constexpr std::string_view kJoinName = "tutti.join";

// "ALLREDUCE", "ALLGATHER", ... as in error messages and the timeline.
std::string_view to_string(Collective op);

// A tensor's dims as negotiated. Up to four live in place: a submission copies its tensor's
// shape here, and a heap vector would be one more allocation and free per op (P3).
using Dims = base::InlineVector<std::int64_t, 4>;

// The dtype and shape of one tensor of an op (several for grouped ops).
struct TensorSpec {
  DataType dtype = DataType::Float32;
  Dims shape;
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

// An op's tensor specs. Nearly every op has one, kept in place for the same reason as Dims.
using TensorSpecs = base::InlineVector<TensorSpec, 1>;

// One rank's submission of one op (a grouped op is one Request with several tensors).
// Members in an order that leaves no padding (Note [Compact inline vector] in
// src/base/inline_vector.h says why size matters).
struct Request {
  int process_set_id = 0;
  Collective op = Collective::Allreduce;
  Device::Kind device = Device::Kind::CPU;
  ReduceOp reduce_op = ReduceOp::Sum;
  base::InlineString name;  // See Note [Names in place] in src/base/inline_string.h.
  int root_rank = -1;       // Broadcast, Reduce, Gather, Scatter: global rank.
  int target_set_id = -1;   // RemoveProcessSet: the set to remove.
  double prescale = 1.0;
  double postscale = 1.0;
  // One spec per tensor. Scatter: the root's input; a non-root's carries only the dtype (its
  // shape is empty: API.md ignores the view a non-root passes).
  TensorSpecs tensors;
  // Alltoall: rows this rank sends to each set rank (equal splits are filled in at the call).
  // Scatter: on the root, the rows each set rank receives (likewise filled in); empty elsewhere.
  std::vector<std::int64_t> splits;
  std::vector<int> set_ranks;  // AddProcessSet: the global ranks of the new set, as given.
  friend bool operator==(const Request&, const Request&) = default;
};

// Whether `a` and `b` are equal but for their (set, name), which the caller has found equal
// already: the rank's cache reaches its request through them (RankCache::lookup()). Request's ==
// without its string comparison, on the path of every op.
inline bool equal_but_key(const Request& a, const Request& b) {
  // Names every member: one added to Request fails to compile here until it is compared below.
  [[maybe_unused]] const auto& [set, op, device, reduce_op, name, root_rank, target_set_id,
                                prescale, postscale, tensors, splits, set_ranks] = a;
  if (a.op != b.op || a.device != b.device || a.reduce_op != b.reduce_op ||
      a.prescale != b.prescale || a.postscale != b.postscale || a.root_rank != b.root_rank ||
      a.target_set_id != b.target_set_id || a.tensors.size() != b.tensors.size() ||
      a.splits != b.splits || a.set_ranks != b.set_ranks) {
    return false;
  }
  // Plain loops: a memcmp() call per shape of a dim or two cost more than the comparison.
  const TensorSpec* x = a.tensors.data();
  const TensorSpec* y = b.tensors.data();
  for (std::size_t t = 0, n = a.tensors.size(); t < n; ++t) {
    const std::size_t dims = x[t].shape.size();
    if (x[t].dtype != y[t].dtype || dims != y[t].shape.size()) return false;
    const std::int64_t* p = x[t].shape.data();
    const std::int64_t* q = y[t].shape.data();
    for (std::size_t d = 0; d < dims; ++d) {
      if (p[d] != q[d]) return false;
    }
  }
  return true;
}

// The coordinator's verdict on one op, identical on every rank of the set.
struct Response {
  // Not `= default`: a response list holds an empty Response for every cache hit, and
  // value-initializing one (resize(), emplace_back()) would then zero all of it first.
  Response() {}  // NOLINT(modernize-use-equals-default)
  // Members in an order that leaves no padding (Note [Compact inline vector] in
  // src/base/inline_vector.h says why size matters).
  int process_set_id = 0;
  Collective op = Collective::Allreduce;
  Device::Kind device = Device::Kind::CPU;
  ReduceOp reduce_op = ReduceOp::Sum;
  bool ok = true;
  base::InlineString name;  // See Note [Names in place] in src/base/inline_string.h.
  int root_rank = -1;
  int target_set_id = -1;  // AddProcessSet: the new set's id. RemoveProcessSet: the set.
  double prescale = 1.0;
  double postscale = 1.0;
  // As agreed (allgather, gather: the first submitter's spec; scatter: the root's input).
  TensorSpecs tensors;
  // Allgather, Gather: dim 0 of every set rank for each tensor, tensor-major
  // (rows[t * set_size + r]; 0 for a joined rank). Empty for other ops.
  std::vector<std::int64_t> rows;
  // Alltoall: the split matrix, sender-major (splits[sender * set_size + receiver]).
  // Scatter: the root's splits, the rows each set rank receives.
  std::vector<std::int64_t> splits;
  std::vector<int> set_ranks;  // AddProcessSet: the new set's sorted global ranks.
  // Set ranks that had joined without submitting this op (their data is absent: zeros in an
  // allreduce, no rows in an allgather). They still take part in the collective; see
  // Note [Join] in negotiation/coordinator.h.
  std::vector<int> joined;
  ErrorCode error_code = ErrorCode::Internal;
  int last_joined_rank = -1;  // Join: the global rank whose join the coordinator saw last.
  std::string error_message;
  friend bool operator==(const Response&, const Response&) = default;
};

// A message from a rank to the coordinator.
struct RequestList {
  std::vector<Request> requests;
  std::vector<std::int32_t> cache_hits;  // Response-cache ids standing for full requests.
  // The desync check's (Note [Desync check] in negotiation/desync_check.h): each request's
  // place in this rank's order of its set's ops (Entry::sequence), parallel to `requests`.
  // Empty unless TUTTI_DEBUG=DETAIL. Not part of Request, whose equality decides cache hits.
  std::vector<std::int64_t> sequences;
  // This rank is stopping, and this is its last message (Note [Shutdown handshake] in
  // background_loop.h): after shutdown() (`shutdown_after_error` false, no message), or
  // stopped by the error in `shutdown_code` and `shutdown_message`.
  bool shutdown = false;
  bool shutdown_after_error = false;
  ErrorCode shutdown_code = ErrorCode::ShutDown;
  std::string shutdown_message;
};

// A message from the coordinator to every rank (or to one rank, for `resend`).
struct ResponseList {
  std::vector<Response> responses;
  // For each response: the cache id it was stored under, or -1; for a run of cache hits, the
  // first id of the run.
  std::vector<std::int32_t> cache_ids;
  // For each response: 0 where it was negotiated; n > 0 where it is an empty Response standing
  // for n ops, the cache hits on ids cache_ids[i] .. cache_ids[i] + n - 1, executed in that order
  // (Note [Hit fast path] in negotiation/coordinator.h; see also response_cache.h).
  std::vector<std::int32_t> hit;
  std::vector<std::int32_t> evicted;  // Cache ids to forget (before inserting new ones).
  std::vector<std::int32_t> resend;   // Cache hits the coordinator no longer knows: resend.
  bool shutdown = false;              // The job is stopping; see `shutdown_code`.
  // Why: an error (a stall, a fault, a rank that stopped on one), or only shutdown() calls,
  // after which every rank is known to reach its own shutdown (Note [Shutdown handshake]).
  bool shutdown_after_error = false;
  ErrorCode shutdown_code = ErrorCode::ShutDown;
  std::string shutdown_message;
  // Autotune (Note [Autotune] in autotune.h): -1, or the fusion threshold (and piece size) in
  // bytes that every rank uses from this list on, this list included; -1, or the cycle time in
  // microseconds every rank's request sender uses from now on.
  std::int64_t fusion_threshold_bytes = -1;
  std::int64_t cycle_time_us = -1;
  // -1, or which host size classes go over MPI rather than shared memory (ops::HostRoutes),
  // from this list on, this list included (Note [Host transport by size] in
  // ops/shm/shm_backend.h).
  std::int32_t host_routes = -1;
};

}  // namespace tutti::core
