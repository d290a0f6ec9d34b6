// SPDX-License-Identifier: Apache-2.0
// The index arithmetic of the batched copy kernel (Note [Batched copy launch] in
// ops/cuda/kernels.h), run on the CPU: for any batch and any block count, the blocks' pieces
// cover every element of every copy exactly once, in bounds, and the blocks' shares of units
// differ by at most one. The kernel calls the same inline functions; kernels_test (gpu suite)
// checks the bytes it moves.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/cuda/kernels.h"

namespace tutti {
namespace {

using ops::cuda::CopyDescriptor;
using ops::cuda::KernelType;

constexpr KernelType kTypes[] = {KernelType::UInt8,   KernelType::Int16,   KernelType::Float16,
                                 KernelType::Float32, KernelType::Float64, KernelType::BFloat16,
                                 KernelType::Int64,   KernelType::Bool};

// Walks every block of a launch of `blocks` over `copies` and checks that each copy's pieces
// tile [0, count) exactly: sorted by start, each begins where the previous ended.
void check_cover(std::vector<CopyDescriptor> copies, std::uint64_t blocks) {
  const std::uint64_t units = ops::cuda::plan_batched_copy(copies.data(), copies.size());
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> pieces(copies.size());
  std::uint64_t fewest = UINT64_MAX;
  std::uint64_t most = 0;
  bool in_bounds = true;
  for (std::uint64_t block = 0; block < blocks; ++block) {
    const ops::cuda::UnitRange share = ops::cuda::block_units(block, blocks, units);
    fewest = std::min(fewest, share.end - share.begin);
    most = std::max(most, share.end - share.begin);
    ops::cuda::for_each_block_range(
        copies.data(), copies.size(), units, block, blocks,
        [&](std::uint64_t index, std::uint64_t begin, std::uint64_t end) {
          in_bounds =
              in_bounds && index < copies.size() && begin < end && end <= copies[index].count;
          if (in_bounds) pieces[index].emplace_back(begin, end);
        });
  }
  INFO("copies " << copies.size() << ", units " << units << ", blocks " << blocks);
  CHECK(in_bounds);
  CHECK(most - fewest <= 1);
  if (blocks >= units) CHECK(most <= 1);
  bool tiled = true;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    std::sort(pieces[i].begin(), pieces[i].end());
    std::uint64_t next = 0;
    for (const auto& [begin, end] : pieces[i]) {
      tiled = tiled && begin == next;
      next = end;
    }
    tiled = tiled && next == copies[i].count;
  }
  CHECK(tiled);
}

TEST_CASE("Batched copy blocks cover every element once, for any batch and block count",
          "[kernels]") {
  std::mt19937_64 random(23);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<CopyDescriptor> copies;
    const int tensors = 1 + static_cast<int>(random() % 40);
    for (int t = 0; t < tensors; ++t) {
      CopyDescriptor copy;
      copy.source_type = kTypes[random() % 8];
      copy.destination_type = kTypes[random() % 8];
      // Empty copies, tiny ones, unit boundaries and several units.
      switch (random() % 5) {
        case 0: copy.count = 0; break;
        case 1: copy.count = 1 + random() % 7; break;
        case 2: copy.count = ops::cuda::copy_unit_elements(copy) * (1 + random() % 3); break;
        default: copy.count = random() % 50000; break;
      }
      copies.push_back(copy);
    }
    for (std::uint64_t blocks : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{7},
                                 std::uint64_t{132}, std::uint64_t{1056}, std::uint64_t{100000}}) {
      check_cover(copies, blocks);
    }
  }
}

TEST_CASE("A unit is 4 KiB of the wider side; ResNet-50's shapes split evenly", "[kernels]") {
  CopyDescriptor pack;
  pack.source_type = KernelType::Float16;
  pack.destination_type = KernelType::Float32;
  CHECK(ops::cuda::copy_unit_elements(pack) == 1024);
  pack.source_type = KernelType::UInt8;
  pack.destination_type = KernelType::UInt8;
  CHECK(ops::cuda::copy_unit_elements(pack) == 4096);
  // Float32 gradients of ResNet-50's kinds (biases, norms, 1x1 and 3x3 convolutions, the fc).
  std::vector<CopyDescriptor> copies;
  for (std::uint64_t n : {1000, 2048000, 2048, 2048, 1048576, 512, 512, 2359296, 256, 64, 9408}) {
    CopyDescriptor copy;
    copy.count = n;
    copies.push_back(copy);
  }
  check_cover(copies, 1056);  // An H100/H200's 132 SMs at 8 resident blocks each.
  check_cover(copies, 3);
}

TEST_CASE("Shares of units have no overflow near 2^64", "[kernels]") {
  const std::uint64_t units = UINT64_MAX - 5;
  const std::uint64_t blocks = 1000;
  std::uint64_t next = 0;
  for (std::uint64_t block = 0; block < blocks; ++block) {
    const ops::cuda::UnitRange share = ops::cuda::block_units(block, blocks, units);
    CHECK(share.begin == next);
    next = share.end;
  }
  CHECK(next == units);
}

}  // namespace
}  // namespace tutti
