// SPDX-License-Identifier: Apache-2.0
// The coordinator's counted cache hits (Note [Hit fast path] in
// src/core/negotiation/coordinator.h): hits counted per id, and every way a counted op moves to the
// named bookkeeping (a full request for the same name, a join, an eviction) or is named by the
// stall inspector. Expected lists are written out from the protocol's rules: cache ids count from 0
// in insertion order.
#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/negotiation/coordinator_stage.h"
#include "src/core/negotiation/hit_table.h"
#include "test/unit/core/negotiation_fixtures.h"

namespace tutti::core {
namespace {

using std::chrono::seconds;
using test::allreduce;
using test::Job;
using test::join_request;
using test::t0;

RequestList full(std::vector<Request> requests) {
  RequestList list;
  list.requests = std::move(requests);
  return list;
}

RequestList hits(std::vector<std::int32_t> ids) {
  RequestList list;
  list.cache_hits = std::move(ids);
  return list;
}

// Negotiates `names` (shape {4}) on every rank of `size`, so that their ids are cached.
std::vector<std::int32_t> warm(Coordinator& c, int size, const std::vector<std::string>& names) {
  std::vector<std::int32_t> resend;
  for (int r = 0; r < size; ++r) {
    std::vector<Request> requests;
    for (const std::string& name : names) requests.push_back(allreduce(name, {4}));
    c.receive(r, full(std::move(requests)), t0, &resend);
  }
  REQUIRE(resend.empty());
  const ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == names.size());
  return list.cache_ids;
}

TEST_CASE("Counted hits are ready in readiness order and replayed", "[coordinator][hits]") {
  const int size = GENERATE(1, 2, 3, 5);
  Job job(size);
  Coordinator c(job.sets, 16, nullptr);
  const std::vector<std::int32_t> ids = warm(c, size, {"a", "b", "c"});
  CHECK(ids == std::vector<std::int32_t>{0, 1, 2});
  std::vector<std::int32_t> resend;
  // Rank 0 sends c, b, a; the others a, then c, then b: c completes on the last rank first.
  c.receive(0, hits({2, 1, 0}), t0, &resend);
  for (int r = 1; r < size; ++r) c.receive(r, hits({0}), t0, &resend);
  for (int r = 1; r < size; ++r) c.receive(r, hits({2}), t0, &resend);
  for (int r = 1; r < size; ++r) c.receive(r, hits({1}), t0, &resend);
  REQUIRE(c.has_ready());
  const ResponseList list = c.take_ready();
  // With one rank, rank 0's list completes every op in its own order.
  const std::vector<std::int32_t> expected =
      size == 1 ? std::vector<std::int32_t>{2, 1, 0} : std::vector<std::int32_t>{0, 2, 1};
  CHECK(list.cache_ids == expected);
  CHECK(list.hit == std::vector<std::uint8_t>{1, 1, 1});
  CHECK(list.evicted.empty());
  CHECK(resend.empty());
  CHECK_FALSE(c.has_ready());
}

TEST_CASE("A full request for a counted name negotiates the op from every request",
          "[coordinator][hits]") {
  const bool request_first = GENERATE(false, true);
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  const std::int32_t a = warm(c, 3, {"a"}).front();
  std::vector<std::int32_t> resend;
  if (request_first) c.receive(2, full({allreduce("a", {5})}), t0, &resend);
  c.receive(0, hits({a}), t0, &resend);
  c.receive(1, hits({a}), t0, &resend);
  if (!request_first) c.receive(2, full({allreduce("a", {5})}), t0, &resend);
  REQUIRE(c.has_ready());
  const ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == 1);
  CHECK(list.hit == std::vector<std::uint8_t>{0});
  CHECK(list.cache_ids == std::vector<std::int32_t>{-1});
  CHECK(list.responses[0].error_code == ErrorCode::Mismatch);
  CHECK(list.responses[0].error_message ==
        "Mismatched ALLREDUCE tensor shapes for 'a': rank 0 sent [4], rank 2 sent [5]");
  CHECK(resend.empty());
}

TEST_CASE("A full request equal to the cached one re-caches the op under a new id",
          "[coordinator][hits]") {
  Job job(2);
  Coordinator c(job.sets, 16, nullptr);
  const std::int32_t a = warm(c, 2, {"a"}).front();
  std::vector<std::int32_t> resend;
  c.receive(0, hits({a}), t0, &resend);
  c.receive(1, full({allreduce("a", {4})}), t0, &resend);
  const ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == 1);
  CHECK(list.responses[0].ok);
  CHECK(list.responses[0].name == "a");
  CHECK(list.hit == std::vector<std::uint8_t>{0});
  CHECK(list.cache_ids == std::vector<std::int32_t>{a + 1});
  CHECK(list.evicted == std::vector<std::int32_t>{a});  // The name's old id.
  // The new id is counted again.
  for (int r : {0, 1}) c.receive(r, hits({a + 1}), t0, &resend);
  CHECK(c.take_ready().hit == std::vector<std::uint8_t>{1});
}

TEST_CASE("A join while hits are counted releases the op with the joined rank absent",
          "[coordinator][hits][join]") {
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  const std::vector<std::int32_t> ids = warm(c, 3, {"g", "h"});
  std::vector<std::int32_t> resend;
  c.receive(0, hits({ids[0], ids[1]}), t0, &resend);
  c.receive(2, hits({ids[1]}), t0, &resend);
  c.receive(2, hits({ids[0]}), t0 + seconds(1), &resend);
  CHECK_FALSE(c.has_ready());
  c.receive(1, full({join_request()}), t0 + seconds(2), &resend);  // Rank 1 has no more data.
  const ResponseList released = c.take_ready();
  // Released in submission order: both were first seen at t0 from rank 0, so by name.
  REQUIRE(released.responses.size() == 2);
  CHECK(released.responses[0].name == "g");
  CHECK(released.responses[1].name == "h");
  for (const Response& response : released.responses) {
    CHECK(response.ok);
    CHECK(response.joined == std::vector<int>{1});
  }
  CHECK(released.hit == std::vector<std::uint8_t>{0, 0});
  CHECK(released.cache_ids == std::vector<std::int32_t>{-1, -1});  // Shaped by a join.
  // While rank 1 has joined, hits are filed by name and released without it.
  c.receive(0, hits({ids[0]}), t0, &resend);
  c.receive(2, hits({ids[0]}), t0, &resend);
  const ResponseList again = c.take_ready();
  REQUIRE(again.responses.size() == 1);
  CHECK(again.responses[0].joined == std::vector<int>{1});
  c.receive(0, full({join_request()}), t0, &resend);
  c.receive(2, full({join_request()}), t0, &resend);
  const ResponseList done = c.take_ready();
  REQUIRE(done.responses.size() == 1);
  CHECK(done.responses[0].op == Collective::Join);
  CHECK(done.responses[0].last_joined_rank == 2);
  // Everyone is back: hits are counted and replayed again.
  for (int r = 0; r < 3; ++r) c.receive(r, hits({ids[1]}), t0, &resend);
  CHECK(c.take_ready().hit == std::vector<std::uint8_t>{1});
  CHECK(resend.empty());
}

TEST_CASE("An op whose hits are all in when a member joins is negotiated afresh",
          "[coordinator][hits][join]") {
  // Every member sent the id before rank 1's join arrived. No hit is replayed while a member
  // has joined (Note [Join]): the op is negotiated from the requests the id stood for. Rank 1
  // has data for it, so no member is absent, and the response is cached again under a new id.
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  const std::int32_t g = warm(c, 3, {"g"}).front();
  std::vector<std::int32_t> resend;
  for (int r = 0; r < 3; ++r) c.receive(r, hits({g}), t0, &resend);
  c.receive(1, full({join_request()}), t0, &resend);
  const ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == 1);
  CHECK(list.hit == std::vector<std::uint8_t>{0});
  CHECK(list.responses[0].ok);
  CHECK(list.responses[0].name == "g");
  CHECK(list.responses[0].joined.empty());
  CHECK(list.cache_ids == std::vector<std::int32_t>{g + 1});
  CHECK(list.evicted == std::vector<std::int32_t>{g});
}

TEST_CASE("An eviction while hits are counted: later members' full requests find them by name",
          "[coordinator][hits][cache]") {
  Job job(2);
  Coordinator c(job.sets, 1, nullptr);  // One entry: b's insert evicts a.
  const std::int32_t a = warm(c, 2, {"a"}).front();
  std::vector<std::int32_t> resend;
  c.receive(0, hits({a}), t0, &resend);
  for (int r : {0, 1}) c.receive(r, full({allreduce("b", {2})}), t0, &resend);
  const ResponseList first = c.take_ready();
  CHECK(first.cache_ids == std::vector<std::int32_t>{a + 1});
  CHECK(first.evicted == std::vector<std::int32_t>{a});
  // Rank 1 applied the eviction: it sends `a` in full, which completes rank 0's hit.
  c.receive(1, full({allreduce("a", {4})}), t0, &resend);
  const ResponseList second = c.take_ready();
  REQUIRE(second.responses.size() == 1);
  CHECK(second.responses[0].ok);
  CHECK(second.responses[0].name == "a");
  CHECK(second.hit == std::vector<std::uint8_t>{0});
  CHECK(second.cache_ids == std::vector<std::int32_t>{a + 2});
  CHECK(second.evicted == std::vector<std::int32_t>{a + 1});
  CHECK(resend.empty());
}

TEST_CASE("An id evicted in the list that would replay it is negotiated afresh",
          "[coordinator][hits][cache]") {
  Job job(2);
  Coordinator c(job.sets, 1, nullptr);
  const std::int32_t a = warm(c, 2, {"a"}).front();
  std::vector<std::int32_t> resend;
  for (int r : {0, 1}) c.receive(r, full({allreduce("b", {2})}), t0, &resend);
  for (int r : {0, 1}) c.receive(r, hits({a}), t0, &resend);
  // b is decided first and its insert evicts a; a, all of whose hits are in, is negotiated from
  // the requests its id stood for, and its insert evicts b.
  const ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == 2);
  CHECK(list.responses[0].name == "b");
  CHECK(list.responses[1].name == "a");
  CHECK(list.responses[1].ok);
  CHECK(list.responses[1].tensors[0].shape == Shape{4});
  CHECK(list.hit == std::vector<std::uint8_t>{0, 0});
  CHECK(list.cache_ids == std::vector<std::int32_t>{a + 1, a + 2});
  CHECK(list.evicted == std::vector<std::int32_t>{a, a + 1});
}

TEST_CASE("Stalls name the missing ranks of counted hits", "[coordinator][hits][stall]") {
  Job job(4);
  Config config;
  config.cache_capacity = 16;
  config.stall_check_time = seconds(2);
  config.stall_shutdown_time = seconds(5);
  CoordinatorStage stage(config, job.sets, nullptr, 4);
  // After the stage's birth (its stall inspector counts from then), not the file's t0: a slow
  // run (sanitizers, a loaded machine) may reach this test seconds after t0.
  const Clock::time_point start = Clock::now();
  for (int r = 0; r < 4; ++r) stage.receive(r, full({allreduce("w", {1})}), start);
  const std::optional<ResponseList> first = stage.take_list(start);
  REQUIRE(first.has_value());
  const std::int32_t w = first->cache_ids.front();
  stage.receive(0, hits({w}), start);
  stage.receive(2, hits({w}), start);
  CHECK_FALSE(stage.take_list(start + seconds(3)).has_value());  // Warned only.
  const std::optional<ResponseList> bye = stage.take_list(start + seconds(6));
  REQUIRE(bye.has_value());
  CHECK(bye->shutdown_code == ErrorCode::Stalled);
  CHECK(bye->shutdown_message.find("missing: rank 1: w; rank 3: w") != std::string::npos);
}

TEST_CASE("The hit table keeps a bit per member, past 64 ranks too", "[hits]") {
  HitTable table;
  const int size = 130;
  HitTable::Pending& pending = table.start(7, nullptr, size, t0);
  int completed_at = -1;
  for (int r = size - 1; r >= 0; --r) {
    if (table.add(pending, r)) completed_at = r;
    if (r == 64) {
      CHECK(pending.has(129));
      CHECK(pending.has(64));
      CHECK_FALSE(pending.has(63));
      CHECK(pending.count == size - 64);
    }
  }
  CHECK(completed_at == 0);
  const HitTable::Pending taken = table.take(7);
  CHECK(taken.count == size);
  CHECK(table.empty());
  // A taken record's node is reused.
  HitTable::Pending& next = table.start(8, nullptr, 2, t0);
  CHECK(next.count == 0);
  CHECK_FALSE(next.has(0));
  CHECK_FALSE(table.add(next, 1));
  CHECK(table.add(next, 0));
}

TEST_CASE("take_op removes a record and hands back what it stood for", "[hits]") {
  HitTable table;
  auto op = std::make_shared<const CoordinatorCache::Entry>(
      CoordinatorCache::Entry{.process_set_id = 3, .name = "w", .requests = {}, .response = {}});
  table.start(5, op, 2, t0);
  table.start(6, nullptr, 2, t0);
  const std::shared_ptr<const CoordinatorCache::Entry> taken = table.take_op(5);
  CHECK(taken == op);
  CHECK(op.use_count() == 2);  // `op` and `taken`: the table let go of its reference.
  CHECK(table.find(5) == nullptr);
  REQUIRE(table.find(6) != nullptr);
  CHECK(table.ids() == std::vector<std::int32_t>{6});
  // The freed record is reused, fresh.
  HitTable::Pending& next = table.start(9, nullptr, 2, t0);
  CHECK(next.count == 0);
  CHECK(next.op == nullptr);
  CHECK_FALSE(table.add(next, 1));
  table.take_op(6);
  table.take_op(9);
  CHECK(table.empty());
}

TEST_CASE("The hit table finds what it holds through growth and deletions", "[hits]") {
  // Against a std::map: ids in runs (as caches hand them out) and scattered, records taken in
  // an order unrelated to their insertion, so that probe runs wrap and shift.
  HitTable table;
  std::map<std::int32_t, int> reference;  // id -> size given to start().
  std::mt19937 random(12);
  for (int round = 0; round < 2000; ++round) {
    const bool add = reference.size() < 5 || (reference.size() < 700 && random() % 3 != 0);
    if (add) {
      std::int32_t id = 0;
      do {
        id = random() % 2 == 0 ? static_cast<std::int32_t>(random() % 1000)
                               : static_cast<std::int32_t>(random() % 100000);
      } while (reference.contains(id));
      const int size = 1 + static_cast<int>(random() % 5);
      table.start(id, nullptr, size, t0);
      reference[id] = size;
    } else {
      auto it = reference.begin();
      std::advance(it, static_cast<long>(random() % reference.size()));
      const HitTable::Pending taken = table.take(it->first);
      CHECK(taken.id == it->first);
      CHECK(taken.size == it->second);
      reference.erase(it);
    }
    if (round % 97 == 0) {
      for (const auto& [id, size] : reference) {
        const HitTable::Pending* found = table.find(id);
        REQUIRE(found != nullptr);
        CHECK(found->size == size);
      }
      CHECK(table.find(-5 + 0) == nullptr);
      std::vector<std::int32_t> ids = table.ids();
      std::sort(ids.begin(), ids.end());
      std::vector<std::int32_t> expected;
      for (const auto& [id, size] : reference) expected.push_back(id);
      CHECK(ids == expected);
    }
  }
  CHECK(table.empty() == reference.empty());
}

}  // namespace
}  // namespace tutti::core
