// SPDX-License-Identifier: Apache-2.0
// assign_buckets(): DistributedDataParallel's grouping of parameters into buckets.
#include "src/nn/parallel/bucket_assignment.h"

namespace tutti::nn::detail {

std::vector<std::vector<std::size_t>> assign_buckets(std::span<const std::size_t> order,
                                                     std::span<const std::int64_t> bytes,
                                                     std::int64_t first_cap_bytes,
                                                     std::int64_t cap_bytes) {
  std::vector<std::vector<std::size_t>> buckets;
  std::vector<std::size_t> current;
  std::int64_t current_bytes = 0;
  for (std::size_t index : order) {
    current.push_back(index);
    current_bytes += bytes[index];
    if (current_bytes >= (buckets.empty() ? first_cap_bytes : cap_bytes)) {
      buckets.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

}  // namespace tutti::nn::detail
