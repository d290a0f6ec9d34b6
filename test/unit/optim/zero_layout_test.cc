// SPDX-License-Identifier: Apache-2.0
// ZeroRedundancyOptimizer's sharding (optimizers/zero_layout.h) against hand-worked cases: the
// greedy largest-first assignment and each shard's order, and bucket_cap_mb in elements.
#include "optimizers/zero_layout.h"

#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::optim::internal {
namespace {

TEST_CASE("ZeRO shards: largest first to the lightest rank, each shard in parameter order",
          "[zero]") {
  // Sizes 10, 40, 30, 20, 5 (parameter 5 frozen) over 2 ranks: 40 -> r0, 30 -> r1, 20 -> r1,
  // 10 -> r0, 5 -> r0 (50 each... r0 50 vs r1 50 at 5: tie -> r0).
  const ZeroLayout layout =
      make_zero_layout({10, 40, 30, 20, 5, 7}, {true, true, true, true, true, false}, 2);
  CHECK(layout.owner == std::vector<int>{0, 0, 1, 1, 0, -1});
  CHECK(layout.shards[0] == std::vector<std::size_t>{0, 1, 4});
  CHECK(layout.shards[1] == std::vector<std::size_t>{2, 3});
  CHECK(layout.shard_elements == std::vector<std::int64_t>{55, 50});
}

TEST_CASE("ZeRO shards: more ranks than parameters leave some shards empty", "[zero]") {
  const ZeroLayout layout = make_zero_layout({3, 3}, {true, true}, 4);
  CHECK(layout.owner == std::vector<int>{0, 1});
  CHECK(layout.shard_elements == std::vector<std::int64_t>{3, 3, 0, 0});
  CHECK(layout.shards[3].empty());
}

TEST_CASE("ZeRO shards balance many parameters to within the largest one", "[zero]") {
  std::vector<std::int64_t> counts;
  for (int i = 0; i < 161; ++i) counts.push_back(1 + (i * 7919) % 2000);
  for (int size : {1, 2, 3, 4, 7}) {
    const ZeroLayout layout =
        make_zero_layout(counts, std::vector<bool>(counts.size(), true), size);
    const auto [lo, hi] =
        std::minmax_element(layout.shard_elements.begin(), layout.shard_elements.end());
    CHECK(*hi - *lo <= *std::max_element(counts.begin(), counts.end()));
    CHECK(std::accumulate(layout.shard_elements.begin(), layout.shard_elements.end(),
                          std::int64_t{0}) ==
          std::accumulate(counts.begin(), counts.end(), std::int64_t{0}));
  }
}

TEST_CASE("ZeRO buckets: bucket_cap_mb in float32 elements, clamped to [1, 2^62]", "[zero]") {
  // 25 MiB of 4-byte floats: 25 * 2^20 / 4.
  CHECK(zero_bucket_elements(25) == 25 * (std::int64_t{1} << 20) / 4);
  CHECK(zero_bucket_elements(1e-4) == 26);  // 104.8576 bytes: 26 floats.
  CHECK(zero_bucket_elements(1e-9) == 1);   // Under one float.
  CHECK(zero_bucket_elements(std::numeric_limits<double>::denorm_min()) == 1);
  // 2^62 elements are 2^44 MiB: the maximum from there on, never an out-of-range conversion.
  const std::int64_t max = std::int64_t{1} << 62;
  CHECK(zero_bucket_elements(0x1p44) == max);
  CHECK(zero_bucket_elements(0x1p43) == max / 2);
  CHECK(zero_bucket_elements(1e30) == max);
  CHECK(zero_bucket_elements(std::numeric_limits<double>::max()) == max);
  CHECK(zero_bucket_elements(std::numeric_limits<double>::infinity()) == max);
}

}  // namespace
}  // namespace tutti::optim::internal
