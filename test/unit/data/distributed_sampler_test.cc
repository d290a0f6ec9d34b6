// SPDX-License-Identifier: Apache-2.0
// DistributedSampler against torch's layout: disjoint equal shares, padding from the start,
// drop_last, and the same shuffle on every replica for a given seed and epoch.
#include "tutti/data/distributed_sampler.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "tutti/error.h"

namespace tutti::data {
namespace {

// Every replica's share, built as each rank of a job would build its own sampler.
std::vector<std::vector<std::size_t>> shares(std::size_t n, int replicas, bool shuffle,
                                             std::uint64_t seed, bool drop_last,
                                             std::uint64_t epoch = 0) {
  std::vector<std::vector<std::size_t>> out;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler sampler(n, replicas, r, shuffle, seed, drop_last);
    sampler.set_epoch(epoch);
    out.push_back(sampler.indices());
  }
  return out;
}

// Undoes the strided split: the global (padded or truncated) list.
std::vector<std::size_t> interleave(const std::vector<std::vector<std::size_t>>& parts) {
  std::vector<std::size_t> global;
  for (std::size_t i = 0; !parts.empty() && i < parts[0].size(); ++i) {
    for (const auto& part : parts) global.push_back(part[i]);
  }
  return global;
}

TEST_CASE("DistributedSampler without shuffle is torch's strided split of 0..n-1", "[sampler]") {
  // 10 samples, 4 replicas: padded to 12 with 0 and 1.
  const auto parts = shares(10, 4, false, 0, false);
  CHECK(parts[0] == std::vector<std::size_t>{0, 4, 8});
  CHECK(parts[1] == std::vector<std::size_t>{1, 5, 9});
  CHECK(parts[2] == std::vector<std::size_t>{2, 6, 0});
  CHECK(parts[3] == std::vector<std::size_t>{3, 7, 1});
  DistributedSampler sampler(10, 4, 2, false);
  CHECK(sampler.num_samples() == 3);
  CHECK(sampler.total_size() == 12);
}

TEST_CASE("DistributedSampler drop_last truncates the tail", "[sampler]") {
  const auto parts = shares(10, 4, false, 0, true);
  CHECK(parts[0] == std::vector<std::size_t>{0, 4});
  CHECK(parts[3] == std::vector<std::size_t>{3, 7});
  CHECK(interleave(parts) == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7});
  // Fewer samples than replicas: everyone gets nothing.
  for (const auto& part : shares(3, 4, true, 5, true)) CHECK(part.empty());
}

TEST_CASE("DistributedSampler pads by cycling when the list is shorter than the padding",
          "[sampler]") {
  // 2 samples, 5 replicas: torch pads [0, 1] with (indices * 2)[:3] = [0, 1, 0].
  const auto parts = shares(2, 5, false, 0, false);
  CHECK(interleave(parts) == std::vector<std::size_t>{0, 1, 0, 1, 0});
  for (const auto& part : parts) CHECK(part.size() == 1);
}

TEST_CASE("DistributedSampler shares are disjoint, equal-sized and cover the data set",
          "[sampler]") {
  const std::size_t n = GENERATE(1, 7, 12, 100, 101);
  const int replicas = GENERATE(1, 2, 3, 4, 8);
  const bool shuffle = GENERATE(false, true);
  const auto parts = shares(n, replicas, shuffle, 17, false, 3);
  const std::size_t expected =
      (n + static_cast<std::size_t>(replicas) - 1) / static_cast<std::size_t>(replicas);
  std::multiset<std::size_t> all;
  for (const auto& part : parts) {
    CHECK(part.size() == expected);
    all.insert(part.begin(), part.end());
  }
  const std::vector<std::size_t> global = interleave(parts);
  // The first n entries are a permutation of 0..n-1; the padding repeats the list's start.
  std::vector<std::size_t> head(global.begin(), global.begin() + static_cast<std::ptrdiff_t>(n));
  std::vector<std::size_t> sorted = head;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::size_t> iota(n);
  std::iota(iota.begin(), iota.end(), std::size_t{0});
  CHECK(sorted == iota);
  for (std::size_t p = n; p < global.size(); ++p) CHECK(global[p] == global[p % n]);
  if (!shuffle) CHECK(head == iota);
  // Disjoint unless padded: exactly n distinct values in total.
  CHECK(std::set<std::size_t>(all.begin(), all.end()).size() == n);
}

TEST_CASE("DistributedSampler shuffles by seed + epoch, identically on every replica",
          "[sampler]") {
  const std::size_t n = 50;
  const auto epoch0 = interleave(shares(n, 3, true, 7, false, 0));
  const auto again = interleave(shares(n, 3, true, 7, false, 0));
  const auto epoch1 = interleave(shares(n, 3, true, 7, false, 1));
  CHECK(epoch0 == again);   // Deterministic.
  CHECK(epoch0 != epoch1);  // set_epoch changes the order...
  std::vector<std::size_t> iota(n);
  std::iota(iota.begin(), iota.end(), std::size_t{0});
  CHECK(epoch0 != std::vector<std::size_t>(iota.begin(), iota.end()));  // ...and it is shuffled.
  // torch seeds with seed + epoch: seed 7 epoch 1 equals seed 8 epoch 0.
  CHECK(epoch1 == interleave(shares(n, 3, true, 8, false, 0)));
  // The global order does not depend on the number of replicas (when no padding is needed).
  const auto one = shares(48, 1, true, 9, false, 2)[0];
  CHECK(interleave(shares(48, 4, true, 9, false, 2)) == one);
  // Without shuffle the epoch has no effect.
  CHECK(shares(n, 3, false, 7, false, 0) == shares(n, 3, false, 7, false, 5));
}

TEST_CASE("DistributedSampler handles an empty data set", "[sampler]") {
  DistributedSampler sampler(0, 3, 1);
  CHECK(sampler.indices().empty());
  CHECK(sampler.num_samples() == 0);
}

TEST_CASE("DistributedSampler rejects a bad rank or replica count", "[sampler]") {
  auto code_of = [](auto&& make) {
    try {
      make();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::Internal;
  };
  CHECK(code_of([] { DistributedSampler(10, 0, 0); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([] { DistributedSampler(10, -2, 0); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([] { DistributedSampler(10, 4, 4); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([] { DistributedSampler(10, 4, -1); }) == ErrorCode::InvalidArgument);
  CHECK_NOTHROW(DistributedSampler(10, 4, 3));
}

}  // namespace
}  // namespace tutti::data
