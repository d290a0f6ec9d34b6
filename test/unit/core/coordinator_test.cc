// SPDX-License-Identifier: Apache-2.0
// The coordinator's negotiation (Note [Negotiation], Note [Join]) and its stage (stalls, the
// shutdown's bye), driven by hand-made RequestLists from N ranks: no threads, no transport
// beyond the process-set table's. Expected lists are written out from the protocol's rules.
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/negotiation/coordinator_stage.h"
#include "test/unit/core/negotiation_fixtures.h"

namespace tutti::core {
namespace {

using std::chrono::seconds;
using test::allreduce;
using test::Job;
using test::list_of;
using test::t0;

std::vector<std::string> names(const ResponseList& list) {
  std::vector<std::string> result;
  for (const Response& r : list.responses) result.push_back(r.name.str());
  return result;
}

TEST_CASE("An op is ready once every member has submitted it, in readiness order",
          "[coordinator]") {
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::int32_t> resend;
  c.receive(0, list_of({allreduce("a", {2}), allreduce("b", {2})}), t0, &resend);
  c.receive(2, list_of({allreduce("b", {2}), allreduce("a", {2})}), t0, &resend);
  CHECK_FALSE(c.has_ready());
  c.receive(1, list_of({allreduce("b", {2})}), t0, &resend);  // b complete first.
  c.receive(1, list_of({allreduce("a", {2})}), t0, &resend);
  REQUIRE(c.has_ready());
  const ResponseList list = c.take_ready();
  CHECK(names(list) == std::vector<std::string>{"b", "a"});
  CHECK(list.responses[0].ok);
  CHECK(list.responses[0].tensors[0].shape == Shape{2});
  CHECK(list.hit == std::vector<std::int32_t>{0, 0});
  CHECK(resend.empty());
  CHECK_FALSE(c.has_ready());
}

TEST_CASE("A disagreement becomes an error response naming both ranks and values",
          "[coordinator]") {
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::int32_t> resend;
  c.receive(0, list_of({allreduce("grad.fc1", {17, 3})}), t0, &resend);
  c.receive(1, list_of({allreduce("grad.fc1", {17, 3})}), t0, &resend);
  c.receive(2, list_of({allreduce("grad.fc1", {17, 4})}), t0, &resend);
  const ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == 1);
  CHECK_FALSE(list.responses[0].ok);
  CHECK(list.responses[0].error_code == ErrorCode::Mismatch);
  CHECK(list.responses[0].error_message ==
        "Mismatched ALLREDUCE tensor shapes for 'grad.fc1': rank 0 sent [17, 3], rank 2 sent "
        "[17, 4]");
  CHECK(list.cache_ids == std::vector<std::int32_t>{-1});  // Errors are never cached.
}

// One member's scatter request: the root sends its input's spec and its splits; the others a
// view of the dtype with no shape (API.md ignores a non-root's view and splits).
Request scatter(int root, int me, DataType dtype, Shape root_shape,
                std::vector<std::int64_t> splits) {
  Request r;
  r.name = "sc";
  r.op = Collective::Scatter;
  r.root_rank = root;
  const bool is_root = me == root;
  r.tensors = {TensorSpec{.dtype = dtype, .shape = is_root ? std::move(root_shape) : Shape{0}}};
  if (is_root) r.splits = std::move(splits);
  return r;
}

TEST_CASE("A scatter takes the root's shape and splits; a disputed dtype or root is Mismatch",
          "[coordinator][rooted]") {
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::int32_t> resend;
  for (int r : {0, 1, 2})
    c.receive(r, list_of({scatter(1, r, DataType::Int32, {6, 4}, {1, 2, 3})}), t0, &resend);
  ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == 1);
  CHECK(list.responses[0].ok);
  CHECK(list.responses[0].op == Collective::Scatter);
  CHECK(list.responses[0].tensors == std::vector<TensorSpec>{{DataType::Int32, {6, 4}}});
  CHECK(list.responses[0].splits == std::vector<std::int64_t>{1, 2, 3});
  // The root's new splits alone renegotiate: the others' requests are those cached.
  c.receive(0, list_of({}, {list.cache_ids[0]}), t0, &resend);
  c.receive(1, list_of({scatter(1, 1, DataType::Int32, {6, 4}, {3, 3, 0})}), t0, &resend);
  c.receive(2, list_of({}, {list.cache_ids[0]}), t0, &resend);
  list = c.take_ready();
  REQUIRE(list.responses.size() == 1);
  CHECK(list.hit == std::vector<std::int32_t>{0});
  CHECK(list.responses[0].splits == std::vector<std::int64_t>{3, 3, 0});
  // A member naming another dtype, then another root.
  c.receive(0, list_of({scatter(1, 0, DataType::Float32, {}, {})}), t0, &resend);
  c.receive(1, list_of({scatter(1, 1, DataType::Int32, {6, 4}, {3, 3, 0})}), t0, &resend);
  c.receive(2, list_of({scatter(1, 2, DataType::Int32, {}, {})}), t0, &resend);
  list = c.take_ready();
  REQUIRE(list.responses.size() == 1);
  CHECK(list.responses[0].error_code == ErrorCode::Mismatch);
  CHECK(list.responses[0].error_message ==
        "Mismatched SCATTER data types for 'sc': rank 0 sent float32, rank 1 sent int32");
  c.receive(0, list_of({scatter(0, 0, DataType::Int32, {3, 1}, {1, 1, 1})}), t0, &resend);
  c.receive(1, list_of({scatter(1, 1, DataType::Int32, {3, 1}, {1, 1, 1})}), t0, &resend);
  c.receive(2, list_of({scatter(1, 2, DataType::Int32, {}, {})}), t0, &resend);
  list = c.take_ready();
  REQUIRE(list.responses.size() == 1);
  CHECK(list.responses[0].error_message ==
        "Mismatched SCATTER root ranks for 'sc': rank 0 sent 0, rank 1 sent 1");
}

TEST_CASE("Rooted ops with a joined member: the root must be there, a scatter needs everyone",
          "[coordinator][rooted]") {
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::int32_t> resend;
  Request join;
  join.name = std::string(kJoinName);
  join.op = Collective::Join;
  c.receive(2, list_of({join}), t0, &resend);
  Request reduce = allreduce("r", {2});
  reduce.op = Collective::Reduce;
  reduce.root_rank = 0;
  Request at_joined = reduce;
  at_joined.name = "r2";
  at_joined.root_rank = 2;
  for (int r : {0, 1}) {
    c.receive(r, list_of({reduce, at_joined, scatter(0, r, DataType::Int32, {3}, {1, 1, 1})}), t0,
              &resend);
  }
  const ResponseList list = c.take_ready();
  REQUIRE(names(list) == std::vector<std::string>{"r", "r2", "sc"});
  CHECK(list.responses[0].ok);
  CHECK(list.responses[0].joined == std::vector<int>{2});
  CHECK(list.responses[1].error_code == ErrorCode::InvalidArgument);
  CHECK(list.responses[1].error_message == "REDUCE 'r2': root rank 2 has joined process set 0");
  CHECK(list.responses[2].error_code == ErrorCode::InvalidArgument);
  CHECK(list.responses[2].error_message ==
        "SCATTER 'sc' cannot run while process set 0 has joined ranks: 2");
}

TEST_CASE("Cache ids from every rank replay the response; a stale id is sent back",
          "[coordinator]") {
  Job job(2);
  Coordinator c(job.sets, 1, nullptr);  // One entry: the second name evicts the first.
  std::vector<std::int32_t> resend;
  for (int r : {0, 1}) c.receive(r, list_of({allreduce("a", {4})}), t0, &resend);
  const ResponseList first = c.take_ready();
  REQUIRE(first.cache_ids.size() == 1);
  const std::int32_t id = first.cache_ids[0];
  CHECK(id >= 0);
  // Round two: both ranks send the id only.
  for (int r : {0, 1}) c.receive(r, list_of({}, {id}), t0, &resend);
  const ResponseList replay = c.take_ready();
  CHECK(replay.hit == std::vector<std::int32_t>{1});
  CHECK(replay.cache_ids == std::vector<std::int32_t>{id});
  // Another name takes the only slot: `a`'s id is evicted, and a later hit on it is resent.
  for (int r : {0, 1}) c.receive(r, list_of({allreduce("b", {4})}), t0, &resend);
  const ResponseList other = c.take_ready();
  CHECK(other.evicted == std::vector<std::int32_t>{id});
  c.receive(1, list_of({}, {id}), t0, &resend);
  CHECK(resend == std::vector<std::int32_t>{id});
}

TEST_CASE("Ops with automatic names are answered uncached and evict nothing", "[coordinator]") {
  // Note [Automatic names are not cached]: "allreduce.noname.<n>" never comes back. One entry
  // holds "a"; twenty unnamed ops go by without an id and leave it cached, so "a" still hits.
  Job job(2);
  Coordinator c(job.sets, 1, nullptr);
  std::vector<std::int32_t> resend;
  for (int r : {0, 1}) c.receive(r, list_of({allreduce("a", {4})}), t0, &resend);
  const std::int32_t id = c.take_ready().cache_ids.at(0);
  REQUIRE(id >= 0);
  for (int n = 0; n < 20; ++n) {
    const std::string name = "allreduce.noname." + std::to_string(n);
    for (int r : {0, 1}) c.receive(r, list_of({allreduce(name, {4})}), t0, &resend);
    const ResponseList list = c.take_ready();
    REQUIRE(list.responses.size() == 1);
    CHECK(list.responses[0].ok);
    CHECK(list.cache_ids == std::vector<std::int32_t>{-1});
    CHECK(list.evicted.empty());
  }
  // A name that only looks alike ("noname" without a number) is cached as any other: it
  // evicts "a", the one entry.
  for (int r : {0, 1}) c.receive(r, list_of({allreduce("allreduce.noname", {4})}), t0, &resend);
  const ResponseList alike = c.take_ready();
  CHECK(alike.cache_ids.at(0) > id);
  CHECK(alike.evicted == std::vector<std::int32_t>{id});
  CHECK(resend.empty());
}

TEST_CASE("A joined rank's absence releases ops; the last join answers with the last joiner",
          "[coordinator][join]") {
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::int32_t> resend;
  Request join;
  join.name = std::string(kJoinName);
  join.op = Collective::Join;
  c.receive(0, list_of({allreduce("g", {3})}), t0, &resend);
  c.receive(2, list_of({allreduce("g", {3})}), t0, &resend);
  c.receive(1, list_of({join}), t0, &resend);  // Rank 1 has no more data.
  const ResponseList released = c.take_ready();
  REQUIRE(names(released) == std::vector<std::string>{"g"});
  CHECK(released.responses[0].joined == std::vector<int>{1});  // Set ranks without data.
  CHECK(released.cache_ids == std::vector<std::int32_t>{-1});  // Shaped by a join: not cached.
  c.receive(2, list_of({join}), t0, &resend);
  c.receive(0, list_of({join}), t0, &resend);
  const ResponseList done = c.take_ready();
  REQUIRE(done.responses.size() == 1);
  CHECK(done.responses[0].op == Collective::Join);
  CHECK(done.responses[0].last_joined_rank == 0);
}

TEST_CASE("A join releases the ops that waited only for it in submission order, then by name",
          "[coordinator][join]") {
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::int32_t> resend;
  // Ranks 0 and 2 submit five ops at four times (the first submission's time counts); rank 1
  // joins.
  const std::vector<std::pair<std::string, int>> ops = {
      {"c", 1}, {"b", 0}, {"z", 3}, {"a", 2}, {"y", 3}};
  for (int rank : {0, 2}) {
    for (const auto& [name, second] : ops)
      c.receive(rank, list_of({allreduce(name, {1})}), t0 + seconds(second), &resend);
  }
  CHECK(c.take_ready().responses.empty());
  c.receive(1, list_of({test::join_request()}), t0 + seconds(4), &resend);
  const ResponseList released = c.take_ready();
  CHECK(names(released) == std::vector<std::string>{"b", "c", "a", "y", "z"});
  for (const Response& response : released.responses) CHECK(response.joined == std::vector<int>{1});
  CHECK_FALSE(c.empty());  // The join waits for ranks 0 and 2.
  CHECK(resend.empty());
}

TEST_CASE("Removing a set drops its pending ops and skips its ops ready later in the list",
          "[coordinator][process_set]") {
  Job job(3);
  REQUIRE(job.sets.add(1, {0, 1}).ok());
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::int32_t> resend;
  Request remove;
  remove.name = "tutti.process_set.0";
  remove.op = Collective::RemoveProcessSet;
  remove.target_set_id = 1;
  // "r" and "s" of set 1 from rank 0; then the removal from everyone, ready first; then "r"
  // from rank 1, ready after it in the same list.
  c.receive(0, list_of({allreduce("r", {1}, 1), allreduce("s", {1}, 1), remove}), t0, &resend);
  c.receive(2, list_of({remove}), t0, &resend);
  c.receive(1, list_of({remove, allreduce("r", {1}, 1)}), t0, &resend);
  const ResponseList list = c.take_ready();
  CHECK(names(list) == std::vector<std::string>{"tutti.process_set.0"});
  REQUIRE(list.responses.size() == 1);
  CHECK(list.responses[0].ok);
  CHECK(list.responses[0].target_set_id == 1);
  // "s", which only rank 0 had sent, went with the set: nothing is pending, nothing stalls.
  CHECK(c.empty());
  CHECK(c.stalls(t0 + seconds(3600), seconds(0)).empty());
  CHECK(resend.empty());
}

TEST_CASE("The coordinator is empty exactly while no submitted op awaits its answer",
          "[coordinator]") {
  // What lets rank 0 nap long (Note [Quiet naps] in idle_policy.h): a pending op keeps it
  // looking, for its stall checks.
  Job job(2);
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::int32_t> resend;
  CHECK(c.empty());
  c.receive(0, list_of({allreduce("a", {2})}), t0, &resend);
  CHECK_FALSE(c.empty());  // Submitted by one rank.
  c.receive(1, list_of({allreduce("a", {2})}), t0, &resend);
  CHECK_FALSE(c.empty());  // Ready, not yet taken.
  const ResponseList first = c.take_ready();
  CHECK(c.empty());
  // Cache hits, counted rather than filed by name.
  REQUIRE(first.cache_ids.size() == 1);
  c.receive(1, list_of({}, {first.cache_ids[0]}), t0, &resend);
  CHECK_FALSE(c.empty());
  c.receive(0, list_of({}, {first.cache_ids[0]}), t0, &resend);
  CHECK_FALSE(c.empty());
  CHECK(c.take_ready().hit == std::vector<std::int32_t>{1});
  CHECK(c.empty());
  // A join waits for the other member.
  Request join;
  join.name = std::string(kJoinName);
  join.op = Collective::Join;
  c.receive(0, list_of({join}), t0, &resend);
  CHECK_FALSE(c.empty());
  c.receive(1, list_of({join}), t0, &resend);
  CHECK(c.take_ready().responses.size() == 1);
  CHECK(c.empty());
  CHECK(resend.empty());
}

TEST_CASE("Set changes: numbered in decision order, duplicates and unknown sets refused",
          "[coordinator][process_set]") {
  Job job(2);
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::int32_t> resend;
  auto change = [](const std::string& name, Collective op, std::vector<int> ranks, int target) {
    Request r;
    r.name = name;
    r.op = op;
    r.set_ranks = std::move(ranks);
    r.target_set_id = target;
    return r;
  };
  // Two adds of the same ranks, and one of others, decided in one list.
  for (int r : {0, 1}) {
    c.receive(r,
              list_of({change("tutti.process_set.0", Collective::AddProcessSet, {1, 0}, -1),
                       change("tutti.process_set.1", Collective::AddProcessSet, {0, 1}, -1),
                       change("tutti.process_set.2", Collective::AddProcessSet, {1}, -1),
                       change("tutti.process_set.3", Collective::RemoveProcessSet, {}, 7)}),
              t0, &resend);
  }
  const ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == 4);
  // {0, 1} is the global set's ranks already.
  CHECK_FALSE(list.responses[0].ok);
  CHECK(list.responses[0].error_message ==
        "ADD_PROCESS_SET of ranks [0, 1]: process set 0 has the same ranks");
  CHECK_FALSE(list.responses[1].ok);
  CHECK(list.responses[2].ok);
  CHECK(list.responses[2].target_set_id == 1);
  CHECK(list.responses[2].set_ranks == std::vector<int>{1});
  CHECK_FALSE(list.responses[3].ok);
  CHECK(list.responses[3].error_message == "REMOVE_PROCESS_SET: process set 7 does not exist");
}

TEST_CASE("Stalls name the missing ranks; past the limit every rank is told Stalled",
          "[coordinator][stall]") {
  Job job(3);
  Config config;
  config.stall_check_time = seconds(2);
  config.stall_shutdown_time = seconds(5);
  CoordinatorStage stage(config, job.sets, nullptr, 3);
  // After the stage's birth (its stall inspector counts from then), not the file's t0: a slow
  // run (sanitizers, a loaded machine) may reach this test seconds after t0.
  const Clock::time_point start = Clock::now();
  stage.receive(0, list_of({allreduce("w", {1})}), start);
  stage.receive(2, list_of({allreduce("w", {1})}), start);
  CHECK_FALSE(stage.take_list(start + seconds(3)).has_value());  // Warned only.
  const std::optional<ResponseList> bye = stage.take_list(start + seconds(6));
  REQUIRE(bye.has_value());
  CHECK(bye->shutdown);
  CHECK(bye->shutdown_code == ErrorCode::Stalled);
  CHECK(bye->shutdown_after_error);
  CHECK(bye->shutdown_message.find("missing: rank 1: w") != std::string::npos);
  CHECK(stage.bye_sent());
  CHECK_FALSE(stage.take_list(start + seconds(7)).has_value());  // Nothing after the bye.
}

TEST_CASE("A stalled op of another process set is named with its set", "[coordinator][stall]") {
  Job job(3);
  REQUIRE(job.sets.add(1, {0, 1}).ok());
  Config config;
  config.stall_check_time = seconds(2);
  config.stall_shutdown_time = seconds(5);
  CoordinatorStage stage(config, job.sets, nullptr, 3);
  const Clock::time_point start = Clock::now();
  // "p" in set {0, 1} from rank 0 only; "p" in the global set from ranks 1 and 2 only.
  stage.receive(0, list_of({allreduce("p", {1}, 1)}), start);
  stage.receive(1, list_of({allreduce("p", {1})}), start);
  stage.receive(2, list_of({allreduce("p", {1})}), start);
  const std::optional<ResponseList> bye = stage.take_list(start + seconds(6));
  REQUIRE(bye.has_value());
  CHECK(bye->shutdown_code == ErrorCode::Stalled);
  INFO(bye->shutdown_message);
  CHECK(bye->shutdown_message.find("missing: rank 0: p; rank 1: p (process set 1)") !=
        std::string::npos);
}

TEST_CASE("A rank that stops on an error takes the job down, after the ready responses",
          "[coordinator][shutdown]") {
  Job job(2);
  CoordinatorStage stage(Config{}, job.sets, nullptr, 2);
  stage.receive(0, list_of({allreduce("x", {1})}), t0);
  stage.receive(1, list_of({allreduce("x", {1})}), t0);
  RequestList last;
  last.shutdown = true;
  last.shutdown_after_error = true;
  last.shutdown_code = ErrorCode::Communication;
  last.shutdown_message = "MPI_Allreduce failed";
  stage.receive(1, last, t0);
  CHECK(stage.all_last_messages());
  const std::optional<ResponseList> bye = stage.take_list(t0);
  REQUIRE(bye.has_value());
  CHECK(names(*bye) == std::vector<std::string>{"x"});
  CHECK(bye->shutdown);
  CHECK(bye->shutdown_code == ErrorCode::ShutDown);
  CHECK(bye->shutdown_message == "rank 1 stopped: MPI_Allreduce failed");
  CHECK(bye->shutdown_after_error);
}

TEST_CASE("A rank's shutdown() is no error: the bye says so (issue 29)",
          "[coordinator][shutdown]") {
  Job job(2);
  CoordinatorStage stage(Config{}, job.sets, nullptr, 2);
  RequestList last;
  last.shutdown = true;  // What RequestSender::take_last sends after shutdown().
  stage.receive(1, last, t0);
  const std::optional<ResponseList> bye = stage.take_list(t0);
  REQUIRE(bye.has_value());
  CHECK(bye->shutdown);
  CHECK(bye->shutdown_code == ErrorCode::ShutDown);
  CHECK(bye->shutdown_message == "rank 1 shut down");
  // Peers free their communicators collectively and leave MPI_Finalize unbounded.
  CHECK_FALSE(bye->shutdown_after_error);
}

}  // namespace
}  // namespace tutti::core
