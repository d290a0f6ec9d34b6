// SPDX-License-Identifier: Apache-2.0
// The process-set table's membership queries, on the coordinator's table of a job of threads
// (test/support/fake_transport.h).
#include "src/core/process_set_table.h"

#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/core/negotiation_fixtures.h"

namespace tutti::core {
namespace {

TEST_CASE("The coordinator is in every set until a set leaves it out", "[process_set]") {
  test::Job job(4);  // Rank 0's table; set 0 holds every rank.
  CHECK(job.sets.in_every_set());
  REQUIRE(job.sets.add(1, {0, 3}).ok());
  CHECK(job.sets.in_every_set());
  REQUIRE(job.sets.add(2, {1, 2}).ok());
  CHECK_FALSE(job.sets.in_every_set());
  REQUIRE(job.sets.add(3, {0, 1, 2}).ok());
  CHECK_FALSE(job.sets.in_every_set());  // Set 2 still leaves rank 0 out.
  job.sets.remove(2);
  CHECK(job.sets.in_every_set());
  job.sets.remove(1);
  job.sets.remove(3);
  CHECK(job.sets.in_every_set());
}

}  // namespace
}  // namespace tutti::core
