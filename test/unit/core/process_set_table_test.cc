// SPDX-License-Identifier: Apache-2.0
// The process-set table's membership queries, on the coordinator's table of a job of threads
// (test/support/fake_transport.h).
#include "src/core/process_set_table.h"

#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/core/negotiation_fixtures.h"

namespace tutti::core {
namespace {

TEST_CASE("A rank is in every set until a set leaves it out", "[process_set]") {
  test::Job job(4);  // Rank 0's table; set 0 holds every rank.
  CHECK(job.sets.every_set_includes(0));
  CHECK(job.sets.every_set_includes(3));
  REQUIRE(job.sets.add(1, {0, 3}).ok());
  CHECK(job.sets.every_set_includes(0));
  CHECK(job.sets.every_set_includes(3));
  CHECK_FALSE(job.sets.every_set_includes(1));
  REQUIRE(job.sets.add(2, {1, 2}).ok());
  CHECK_FALSE(job.sets.every_set_includes(0));
  CHECK_FALSE(job.sets.every_set_includes(3));
  REQUIRE(job.sets.add(3, {0, 1, 2}).ok());
  CHECK_FALSE(job.sets.every_set_includes(0));  // Set 2 still leaves rank 0 out.
  job.sets.remove(2);
  CHECK(job.sets.every_set_includes(0));
  CHECK_FALSE(job.sets.every_set_includes(3));  // Set 3 leaves it out.
  job.sets.remove(1);
  job.sets.remove(3);
  CHECK(job.sets.every_set_includes(0));
  CHECK(job.sets.every_set_includes(1));
}

}  // namespace
}  // namespace tutti::core
