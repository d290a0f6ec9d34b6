// SPDX-License-Identifier: Apache-2.0
#include "src/core/fusion_planner.h"

#include <unordered_map>

namespace tutti::core {

std::vector<std::vector<std::size_t>> plan_fusion(std::span<const FusionItem> items,
                                                  std::size_t threshold_bytes) {
  std::vector<std::vector<std::size_t>> batches;
  struct Open {
    std::size_t batch = 0;
    std::size_t bytes = 0;
  };
  std::unordered_map<std::uint64_t, Open> open;  // The batch still accepting each key.
  for (std::size_t i = 0; i < items.size(); ++i) {
    const FusionItem& item = items[i];
    auto it = open.find(item.key);
    if (it != open.end() && it->second.bytes + item.bytes <= threshold_bytes) {
      batches[it->second.batch].push_back(i);
      it->second.bytes += item.bytes;
      continue;
    }
    batches.push_back({i});
    // Rule 2: an item at or over the threshold travels alone and leaves the open batch open.
    if (item.bytes < threshold_bytes)
      open[item.key] = Open{.batch = batches.size() - 1, .bytes = item.bytes};
  }
  return batches;
}

}  // namespace tutti::core
