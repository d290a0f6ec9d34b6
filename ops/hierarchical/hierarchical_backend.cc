// SPDX-License-Identifier: Apache-2.0
// See Note [Hierarchical schedules] in hierarchical_backend.h.
#include "ops/hierarchical/hierarchical_backend.h"

#include <algorithm>

#include "src/common/check.h"

namespace tutti::ops::hierarchical {

HierarchicalBackend::HierarchicalBackend(Parts parts, HostLayout layout, Thresholds thresholds)
    : flat_(std::move(parts.flat)),
      local_(std::move(parts.local)),
      cross_(std::move(parts.cross)),
      layout_(std::move(layout)),
      thresholds_(thresholds) {
  TUTTI_CHECK(layout_.hierarchical() && layout_.size() == flat_->size(),
              "a hierarchical backend over a layout without a hierarchy");
  const auto me = static_cast<std::size_t>(flat_->rank());
  TUTTI_CHECK(local_->rank() == layout_.local_index_of[me] &&
                  local_->size() == static_cast<int>(layout_.members.front().size()) &&
                  cross_->rank() == layout_.host_of[me] && cross_->size() == layout_.hosts(),
              "the intra- and cross-host backends do not match the host layout");
}

std::byte* HierarchicalBackend::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

Status HierarchicalBackend::allreduce(void* data, std::size_t count, DataType dtype, WireOp op) {
  if (count * element_size(dtype) < thresholds_.allreduce_bytes || count == 0)
    return flat_->allreduce(data, count, dtype, op);
  const std::vector<std::size_t> slices = split_evenly(count, local_->size());
  const std::size_t mine = slices[static_cast<std::size_t>(local_->rank())];
  std::byte* slice = scratch(mine * element_size(dtype));
  TUTTI_RETURN_IF_ERROR(local_->reducescatter(data, slice, slices, dtype, op));
  TUTTI_RETURN_IF_ERROR(cross_->allreduce(slice, mine, dtype, op));
  return local_->allgatherv(slice, data, slices, dtype);
}

Status HierarchicalBackend::allgatherv(const void* input, void* output,
                                       std::span<const std::size_t> counts, DataType dtype) {
  TUTTI_CHECK(counts.size() == static_cast<std::size_t>(size()),
              "allgatherv needs one count per rank");
  const std::size_t bytes = element_size(dtype);
  std::size_t total = 0;
  for (std::size_t count : counts) total += count;
  if (total * bytes < thresholds_.allgather_bytes || total == 0)
    return flat_->allgatherv(input, output, counts, dtype);
  const auto me = static_cast<std::size_t>(rank());
  const auto my_host = static_cast<std::size_t>(layout_.host_of[me]);
  std::vector<std::size_t> host_counts(static_cast<std::size_t>(layout_.hosts()), 0);
  std::vector<std::size_t> offset_of(counts.size());  // Of each set rank's rows in the output.
  for (std::size_t r = 0, offset = 0; r < counts.size(); offset += counts[r++]) {
    host_counts[static_cast<std::size_t>(layout_.host_of[r])] += counts[r];
    offset_of[r] = offset;
  }
  std::vector<std::size_t> local_counts;
  for (int member : layout_.members[my_host])
    local_counts.push_back(counts[static_cast<std::size_t>(member)]);

  const bool in_place = layout_.contiguous();
  std::byte* block = scratch((host_counts[my_host] + (in_place ? 0 : total)) * bytes);
  std::byte* gathered =
      in_place ? static_cast<std::byte*>(output) : block + host_counts[my_host] * bytes;
  TUTTI_RETURN_IF_ERROR(local_->allgatherv(input, block, local_counts, dtype));
  if (local_->rank() == 0) {
    TUTTI_RETURN_IF_ERROR(cross_->allgatherv(block, gathered, host_counts, dtype));
  }
  TUTTI_RETURN_IF_ERROR(local_->broadcast(gathered, total, dtype, 0));
  if (in_place) return Status();
  // `gathered` holds host after host, each host's members in set-rank order.
  const std::byte* from = gathered;
  for (const std::vector<int>& host : layout_.members) {
    for (int member : host) {
      const auto r = static_cast<std::size_t>(member);
      std::copy_n(from, counts[r] * bytes, static_cast<std::byte*>(output) + offset_of[r] * bytes);
      from += counts[r] * bytes;
    }
  }
  return Status();
}

}  // namespace tutti::ops::hierarchical
