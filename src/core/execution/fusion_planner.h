// SPDX-License-Identifier: Apache-2.0
// Which negotiated ops travel together in one collective.
//
// Note [Fusion rules]
// 1. Only ops with the same key fuse: same process set, collective, wire dtype, wire op and
//    device, and for rooted ops (reduce, gather) the same root. Ops of other keys in between do
//    not break a batch (every rank sees the same list, so grouping across it is the same
//    decision everywhere).
// 2. A batch holds at most `threshold_bytes` of wire data; an op bigger than that travels
//    alone (the executor then works on the tensor in place, in pieces). threshold 0 = never fuse.
// 3. A grouped op is one item: its tensors are never split across batches.
// 4. Batches come out in the order of their first op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tutti::core {

struct FusionItem {
  std::uint64_t key = 0;  // Equal keys (and roots) may fuse (rule 1).
  std::size_t bytes = 0;  // Wire bytes of the whole item.
  int root = -1;          // Rooted ops: the root's global rank; -1 for the others.
};

// Indices into `items`, one vector per batch. Pure function.
std::vector<std::vector<std::size_t>> plan_fusion(std::span<const FusionItem> items,
                                                  std::size_t threshold_bytes);

}  // namespace tutti::core
