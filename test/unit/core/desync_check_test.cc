// SPDX-License-Identifier: Apache-2.0
// The desync check (Note [Desync check]): ranks' ops lined up by place in each set, joins, and
// the coordinator stage stopping the job with Mismatch. Requests are hand-made lists from N
// ranks; the expected findings follow from the rule (same op at the same place).
#include "src/core/negotiation/desync_check.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/negotiation/coordinator_stage.h"
#include "test/unit/core/negotiation_fixtures.h"

namespace tutti::core {
namespace {

using test::allreduce;
using test::Job;
using test::join_request;
using test::list_of;
using test::t0;

// A rank's list of `requests`, numbered from `first` on (its queue's sequence numbers).
RequestList numbered(std::vector<Request> requests, std::int64_t first, int set = 0) {
  RequestList list = list_of(std::move(requests));
  for (std::size_t i = 0; i < list.requests.size(); ++i) {
    list.requests[i].process_set_id = set;
    list.sequences.push_back(first + static_cast<std::int64_t>(i));
  }
  return list;
}

TEST_CASE("Ranks submitting a set's ops in one order pass, in any interleaving", "[desync]") {
  Job job(3);
  DesyncCheck check(job.sets);
  for (std::int64_t step = 0; step < 50; ++step) {
    const std::int64_t first = 2 * step;
    for (int rank : {2, 0, 1}) {
      const RequestList list = numbered({allreduce("a", {2}), allreduce("b", {2})}, first);
      REQUIRE(check.observe(rank, list).ok());
    }
  }
}

TEST_CASE("A rank that skipped an op is reported with both ranks' recent ops", "[desync]") {
  Job job(3);
  DesyncCheck check(job.sets);
  CHECK(check.observe(0, numbered({allreduce("w", {1}), allreduce("a", {2})}, 0)).ok());
  CHECK(check.observe(2, numbered({allreduce("w", {1}), allreduce("a", {2})}, 0)).ok());
  const Status status = check.observe(1, numbered({allreduce("w", {1}), allreduce("b", {2})}, 0));
  REQUIRE(status.code() == ErrorCode::Mismatch);
  const std::string message(status.message());
  CHECK_THAT(message, Catch::Contains("desync in process set 0 (TUTTI_DEBUG=DETAIL)"));
  CHECK_THAT(message, Catch::Contains("rank 1 submitted seq 1 ALLREDUCE 'b' where rank 0 "
                                      "submitted seq 1 ALLREDUCE 'a'"));
  CHECK_THAT(message, Catch::Contains("rank 0's last ops: seq 0 ALLREDUCE 'w', seq 1 ALLREDUCE "
                                      "'a'"));
  CHECK_THAT(message, Catch::Contains("rank 1's last ops: seq 0 ALLREDUCE 'w', seq 1 ALLREDUCE "
                                      "'b'"));
  // One report: later lists are not checked.
  CHECK(check.observe(1, numbered({allreduce("c", {2})}, 2)).ok());
}

TEST_CASE("Ops in another order, or another collective under the name, are a desync", "[desync]") {
  Job job(2);
  SECTION("reordered, the check turned on by HOROVOD_DEBUG") {
    DesyncCheck check(job.sets, "HOROVOD_DEBUG=detail");
    CHECK(check.observe(0, numbered({allreduce("a", {2}), allreduce("b", {2})}, 0)).ok());
    const Status status = check.observe(1, numbered({allreduce("b", {2}), allreduce("a", {2})}, 0));
    REQUIRE(status.code() == ErrorCode::Mismatch);
    CHECK_THAT(std::string(status.message()),
               Catch::Contains("desync in process set 0 (HOROVOD_DEBUG=detail): rank 1 submitted "
                               "seq 0 ALLREDUCE 'b' where rank 0"));
  }
  SECTION("another collective") {
    DesyncCheck check(job.sets);
    CHECK(check.observe(1, numbered({allreduce("a", {2})}, 0)).ok());
    Request gather = allreduce("a", {2});
    gather.op = Collective::Allgather;
    const Status status = check.observe(0, numbered({gather}, 0));
    REQUIRE(status.code() == ErrorCode::Mismatch);
    CHECK_THAT(std::string(status.message()),
               Catch::Contains("rank 0 submitted seq 0 ALLGATHER 'a' where rank 1 submitted seq "
                               "0 ALLREDUCE 'a'"));
  }
}

TEST_CASE("A join parts the ranks until it completes; their places start again after it",
          "[desync]") {
  Job job(2);
  DesyncCheck check(job.sets);
  // Rank 1 runs out of data after one step; rank 0 trains two more, then joins too.
  CHECK(check.observe(1, numbered({allreduce("g", {2}), join_request()}, 0)).ok());
  CHECK(check.observe(0, numbered({allreduce("g", {2}), allreduce("g2", {2})}, 0)).ok());
  CHECK(check.observe(0, numbered({allreduce("g3", {2}), join_request()}, 2)).ok());
  // After the join: rank 0 is at seq 4, rank 1 at seq 2, and their ops line up again.
  CHECK(check.observe(1, numbered({allreduce("next", {2})}, 2)).ok());
  CHECK(check.observe(0, numbered({allreduce("next", {2})}, 4)).ok());
  const Status status = check.observe(1, numbered({allreduce("x", {2})}, 3));
  CHECK(status.ok());
  const Status late = check.observe(0, numbered({allreduce("y", {2})}, 5));
  REQUIRE(late.code() == ErrorCode::Mismatch);
  CHECK_THAT(std::string(late.message()),
             Catch::Contains("rank 0 submitted seq 5 ALLREDUCE 'y' where rank 1 submitted seq 3 "
                             "ALLREDUCE 'x'"));
}

TEST_CASE("Each set is lined up on its own; ops of sets a rank is not in are skipped", "[desync]") {
  Job job(3);
  REQUIRE(job.sets.add(1, {0, 2}).ok());
  DesyncCheck check(job.sets);
  CHECK(check.observe(0, numbered({allreduce("s", {2})}, 0, 1)).ok());
  CHECK(check.observe(0, numbered({allreduce("g", {2})}, 0, 0)).ok());
  CHECK(check.observe(1, numbered({allreduce("t", {2})}, 0, 1)).ok());  // Not a member of 1.
  CHECK(check.observe(2, numbered({allreduce("g", {2})}, 0, 0)).ok());
  CHECK(check.observe(2, numbered({allreduce("s", {2})}, 0, 1)).ok());
  CHECK(check.observe(1, numbered({allreduce("g", {2})}, 1, 0)).ok());
  CHECK(check.observe(7, numbered({allreduce("g", {2})}, 0, 9)).ok());  // No such set.
}

TEST_CASE("A list without sequence numbers is an internal error", "[desync]") {
  Job job(2);
  DesyncCheck check(job.sets);
  const Status status = check.observe(1, list_of({allreduce("a", {2})}));
  CHECK(status.code() == ErrorCode::Internal);
}

TEST_CASE("With TUTTI_DEBUG=DETAIL the coordinator stage stops the job with the Mismatch",
          "[desync]") {
  Job job(2);
  Config config;
  config.desync_check = true;
  config.cache_capacity = 0;
  CoordinatorStage stage(config, job.sets, nullptr, 2);
  stage.receive(0, numbered({allreduce("a", {2}), allreduce("b", {2})}, 0), t0);
  stage.receive(1, numbered({allreduce("b", {2})}, 0), t0);
  const std::optional<ResponseList> bye = stage.take_list(t0);
  REQUIRE(bye.has_value());
  CHECK(bye->shutdown);
  CHECK(bye->shutdown_after_error);
  CHECK(bye->shutdown_code == ErrorCode::Mismatch);
  CHECK_THAT(bye->shutdown_message, Catch::Contains("rank 1 submitted seq 0 ALLREDUCE 'b'"));
  // Rank 1's list, which diverged, was not filed: 'b' is not ready, nothing runs.
  CHECK(bye->responses.empty());
  CHECK(stage.bye_sent());
}

}  // namespace
}  // namespace tutti::core
