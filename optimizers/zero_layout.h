// SPDX-License-Identifier: Apache-2.0
// How ZeroRedundancyOptimizer shards the parameters, and where each parameter lies in its
// owner's flat shard; the buckets of its collectives are element ranges of those shards.
// Internal to optimizers/, apart from zero.cc for unit tests.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "tutti/optim/zero.h"

namespace tutti::optim::internal {

// What ZeroRedundancyOptimizer's errors and the names of its collectives start with.
inline constexpr char kWho[] = "ZeroRedundancyOptimizer";

// Note [ZeRO layout]
// Set rank r owns the parameters shards[r] (in parameter order) and their values concatenate,
// in that order, into its flat shard of shard_elements[r] elements; parameter i starts at
// offset[i] there. Buckets are element ranges [b·B, (b+1)·B) of every shard at once (B = the
// bucket size), so bucket b of the allgather carries each member's elements in that range
// (fewer, or none, from smaller shards), and bucket b of stage 2's reduce-scatter is an
// N x min(B, W - b·B) matrix, W the largest shard, whose row r holds rank r's range (zero past
// its shard): each member receives its own row. Every rank computes the same layout from the
// same parameter sizes, so the collectives agree without negotiation of their own.
struct ZeroLayout {
  std::vector<std::int64_t> counts;              // Per parameter: elements.
  std::vector<int> owner;                        // Per parameter: set rank; -1 without grad.
  std::vector<std::int64_t> offset;              // Per parameter: start in its owner's shard.
  std::vector<std::vector<std::size_t>> shards;  // Per set rank: parameter indices, in order.
  std::vector<std::int64_t> shard_elements;      // Per set rank.

  std::int64_t largest_shard() const {
    return shard_elements.empty() ? 0
                                  : *std::max_element(shard_elements.begin(), shard_elements.end());
  }
  // Elements of rank r's shard within [begin, begin + width).
  std::int64_t piece(int rank, std::int64_t begin, std::int64_t width) const {
    return std::clamp<std::int64_t>(shard_elements[static_cast<std::size_t>(rank)] - begin, 0,
                                    width);
  }
};

// Greedy largest-first assignment (PyTorch's _partition_parameters): parameters that are
// `trainable`, by element count descending (ties in parameter order), each to the set rank with
// the fewest elements so far (ties to the lower rank).
ZeroLayout make_zero_layout(const std::vector<std::int64_t>& counts,
                            const std::vector<bool>& trainable, int size);

// Calls f(parameter, element offset within it, offset within [begin, end), count) for each
// piece of rank `rank`'s shard that lies in [begin, end).
template <class F>
void for_each_piece(const ZeroLayout& layout, int rank, std::int64_t begin, std::int64_t end,
                    F&& f) {
  for (std::size_t i : layout.shards[static_cast<std::size_t>(rank)]) {
    const std::int64_t first = std::max(begin, layout.offset[i]);
    const std::int64_t last = std::min(end, layout.offset[i] + layout.counts[i]);
    if (first < last) f(i, first - layout.offset[i], first - begin, last - first);
  }
}

}  // namespace tutti::optim::internal

namespace tutti::optim {

// The public class's name for its layout (declared privately in tutti/optim/zero.h).
struct ZeroRedundancyOptimizer::Layout : internal::ZeroLayout {
  explicit Layout(internal::ZeroLayout layout) : internal::ZeroLayout(std::move(layout)) {}
};

}  // namespace tutti::optim
