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
  // Runs of items share a key (a step's gradients, P3's 10,000 tiny tensors): the previous
  // item's batch is found without hashing.
  Open* last = nullptr;
  std::pair<std::uint64_t, int> last_key;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const FusionItem& item = items[i];
    const std::pair<std::uint64_t, int> key(item.key, item.root);
    Open* batch = nullptr;
    if (last != nullptr && key == last_key) {
      batch = last;
    } else if (auto it = open.find(key); it != open.end()) {
      batch = &it->second;
    }
    if (batch != nullptr && batch->bytes + item.bytes <= threshold_bytes) {
      batches[batch->batch].push_back(i);
      batch->bytes += item.bytes;
      last = batch;
      last_key = key;
      continue;
    }
    batches.push_back({i});
    // Rule 2: an item at or over the threshold travels alone and leaves the open batch open.
    if (item.bytes < threshold_bytes) {
      Open& opened = open[key];  // Map values stay put: `last` stays valid as the map grows.
      opened = Open{.batch = batches.size() - 1, .bytes = item.bytes};
      last = &opened;
      last_key = key;
    } else {
      last = nullptr;
    }
  }
  return batches;
}

}  // namespace tutti::core
