// SPDX-License-Identifier: Apache-2.0
// How DistributedDataParallel groups parameters into buckets: a pure function, so that it is the
// same on every rank given the same order (and testable without a runtime). Private to src/nn.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tutti::nn::detail {

// Splits `order` (parameter indices, in the order their gradients are expected) into
// consecutive buckets, as PyTorch's compute_bucket_assignment_by_size does: parameters join the
// current bucket until its bytes reach the cap, which closes it; the first bucket's cap is
// `first_cap_bytes`, every later one's `cap_bytes`. So a bucket may overshoot its cap by its
// last parameter, and a parameter larger than the cap closes its bucket at once. `bytes[i]` is
// parameter i's gradient size. Empty `order`: no bucket.
std::vector<std::vector<std::size_t>> assign_buckets(std::span<const std::size_t> order,
                                                     std::span<const std::int64_t> bytes,
                                                     std::int64_t first_cap_bytes,
                                                     std::int64_t cap_bytes);

}  // namespace tutti::nn::detail
