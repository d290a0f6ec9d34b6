// SPDX-License-Identifier: Apache-2.0
#include "src/core/execution/fusion_planner.h"

#include <functional>
#include <unordered_map>
#include <utility>

namespace tutti::core {

std::vector<std::vector<std::size_t>> plan_fusion(std::span<const FusionItem> items,
                                                  std::size_t threshold_bytes) {
  std::vector<std::vector<std::size_t>> batches;
  struct Open {
    std::size_t batch = 0;
    std::size_t bytes = 0;
  };
  // The batch still accepting each (key, root).
  struct KeyHash {
    std::size_t operator()(const std::pair<std::uint64_t, int>& k) const {
      return std::hash<std::uint64_t>()(
          k.first ^ (static_cast<std::uint64_t>(k.second + 1) * 0x9e3779b97f4a7c15ULL));
    }
  };
  std::unordered_map<std::pair<std::uint64_t, int>, Open, KeyHash> open;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const FusionItem& item = items[i];
    const std::pair<std::uint64_t, int> key(item.key, item.root);
    auto it = open.find(key);
    if (it != open.end() && it->second.bytes + item.bytes <= threshold_bytes) {
      batches[it->second.batch].push_back(i);
      it->second.bytes += item.bytes;
      continue;
    }
    batches.push_back({i});
    // Rule 2: an item at or over the threshold travels alone and leaves the open batch open.
    if (item.bytes < threshold_bytes)
      open[key] = Open{.batch = batches.size() - 1, .bytes = item.bytes};
  }
  return batches;
}

}  // namespace tutti::core
