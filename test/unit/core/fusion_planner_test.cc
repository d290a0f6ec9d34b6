// SPDX-License-Identifier: Apache-2.0
#include "src/core/execution/fusion_planner.h"

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

using Batches = std::vector<std::vector<std::size_t>>;

TEST_CASE("Items of one key fuse up to the threshold", "[fusion]") {
  const std::vector<FusionItem> items = {{1, 40}, {1, 40}, {1, 40}, {1, 10}};
  CHECK(plan_fusion(items, 100) == Batches{{0, 1}, {2, 3}});
  CHECK(plan_fusion(items, 130) == Batches{{0, 1, 2, 3}});
}

TEST_CASE("Different keys never fuse, but do not break each other's batches", "[fusion]") {
  const std::vector<FusionItem> items = {{1, 10}, {2, 10}, {1, 10}, {2, 10}};
  CHECK(plan_fusion(items, 100) == Batches{{0, 2}, {1, 3}});
}

TEST_CASE("An item at or over the threshold travels alone", "[fusion]") {
  const std::vector<FusionItem> items = {{1, 10}, {1, 500}, {1, 10}};
  CHECK(plan_fusion(items, 100) == Batches{{0, 2}, {1}});
  CHECK(plan_fusion(items, 0) == Batches{{0}, {1}, {2}});
}

TEST_CASE("Rooted items of one key fuse only with the same root", "[fusion]") {
  // Issue 24: reduces (and gathers) with different roots run different collectives.
  const std::vector<FusionItem> items = {
      {1, 10, 0}, {1, 10, 2}, {1, 10, 0}, {1, 10, 2}, {1, 10, -1}};
  CHECK(plan_fusion(items, 100) == Batches{{0, 2}, {1, 3}, {4}});
}

TEST_CASE("A run of one key continues in the batch it left open around full and lone items",
          "[fusion]") {
  // The planner finds a run's batch without a lookup; an overflow, an item over the threshold
  // and another key in between must still land each item where the rules put it.
  const std::vector<FusionItem> items = {{1, 40}, {1, 40}, {1, 40}, {1, 500},
                                         {1, 10}, {2, 10}, {1, 10}};
  CHECK(plan_fusion(items, 100) == Batches{{0, 1}, {2, 4, 6}, {3}, {5}});
}

TEST_CASE("Empty input gives no batches", "[fusion]") { CHECK(plan_fusion({}, 100).empty()); }

}  // namespace
}  // namespace tutti::core
