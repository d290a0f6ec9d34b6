// SPDX-License-Identifier: Apache-2.0
// How ZeroRedundancyOptimizer shards the parameters (which set rank owns each one), and the
// count of the members its collective calls start with.
// Internal to optimizers/, apart from zero.cc for unit tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "tutti/collectives.h"
#include "tutti/optim/zero.h"
#include "tutti/process_set.h"

namespace tutti::optim::internal {

// What ZeroRedundancyOptimizer's errors and the names of its collectives start with.
inline constexpr char kWho[] = "ZeroRedundancyOptimizer";

// Note [ZeRO layout]
// Set rank r owns the parameters shards[r] (in parameter order), shard_elements[r] elements in
// all; it keeps their optimizer state and steps them, and each travels to or from its owner
// in place (Note [ZeRO's collectives] in optimizers/zero.cc). Every rank computes the same
// layout from the same parameter sizes, so the collectives agree without negotiation of their
// own.
struct ZeroLayout {
  std::vector<std::int64_t> counts;              // Per parameter: elements.
  std::vector<int> owner;                        // Per parameter: set rank; -1 without grad.
  std::vector<std::vector<std::size_t>> shards;  // Per set rank: parameter indices, in order.
  std::vector<std::int64_t> shard_elements;      // Per set rank.
};

// Greedy largest-first assignment (PyTorch's _partition_parameters): parameters that are
// `trainable`, by element count descending (ties in parameter order), each to the set rank with
// the fewest elements so far (ties to the lower rank).
ZeroLayout make_zero_layout(const std::vector<std::int64_t>& counts,
                            const std::vector<bool>& trainable, int size);

// A member that has joined (tutti::join()) contributes zero to an allreduce, so a one-element
// Sum of ones counts the members taking part (Note [ZeRO's collectives] in optimizers/zero.cc).
// Starts that count into `live` (valid until the handle is waited for) as the op
// "ZeroRedundancyOptimizer.<what>.members".
Handle count_members(std::int32_t& live, const ProcessSet& set, const char* what);
// Throws InvalidArgument ("<kWho>::<where>: <k> of <n> members have joined ...") when `live` is
// short of the set's size.
void require_every_member(std::int32_t live, const ProcessSet& set, const char* where);

// The most elements one collective of a step moves: 2^62, exact as a double and far above any
// tensor's element count, so that step()'s `at += bucket` over a parameter cannot overflow.
inline constexpr std::int64_t kMaxBucketElements = std::int64_t{1} << 62;

// ZeroOptions::bucket_cap_mb (MiB of float32) as elements, clamped to [1, kMaxBucketElements]:
// a huge finite cap (1e30) is the maximum, not a double-to-int64 conversion out of range
// (undefined behaviour; in practice INT64_MIN, then a bucket of 1 element).
inline std::int64_t zero_bucket_elements(double bucket_cap_mb) {
  const double elements = bucket_cap_mb * (1024.0 * 1024.0) / sizeof(float);
  if (!(elements >= 1)) return 1;  // Also NaN.
  if (elements >= static_cast<double>(kMaxBucketElements)) return kMaxBucketElements;
  return static_cast<std::int64_t>(elements);
}

}  // namespace tutti::optim::internal

namespace tutti::optim {

// The public class's name for its layout (declared privately in tutti/optim/zero.h).
struct ZeroRedundancyOptimizer::Layout : internal::ZeroLayout {
  explicit Layout(internal::ZeroLayout layout) : internal::ZeroLayout(std::move(layout)) {}
};

}  // namespace tutti::optim
