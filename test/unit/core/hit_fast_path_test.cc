// SPDX-License-Identifier: Apache-2.0
// The coordinator's counted cache hits (Note [Hit fast path] in
// src/core/negotiation/coordinator.h): hits counted per id, and every way a counted op moves to the
// named bookkeeping (a full request for the same name, a join, an eviction) or is named by the
// stall inspector. Expected lists are written out from the protocol's rules: cache ids count from 0
// in insertion order.
#include <algorithm>
#include <bit>
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
  CHECK(list.hit == std::vector<std::int32_t>{1, 1, 1});
  CHECK(list.evicted.empty());
  CHECK(resend.empty());
  CHECK_FALSE(c.has_ready());
}

TEST_CASE("Runs of hits cut differently by each rank are replayed as runs, in readiness order",
          "[coordinator][hits]") {
  Job job(3);
  Coordinator c(job.sets, 16, nullptr);
  std::vector<std::string> names;
  for (int i = 0; i < 10; ++i) names.push_back("t" + std::to_string(i));
  const std::vector<std::int32_t> ids = warm(c, 3, names);
  REQUIRE(ids == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::vector<std::int32_t> resend;
  c.receive(0, hits(ids), t0, &resend);
  c.receive(1, hits({0, 1, 2, 3, 4}), t0, &resend);
  c.receive(1, hits({5, 6, 7, 8, 9}), t0, &resend);
  CHECK_FALSE(c.has_ready());
  // Rank 2 completes 3-4 and 5-9, then 0-2: ids 3-9 are ready before 0-2.
  c.receive(2, hits({3, 4, 5, 6, 7, 8, 9}), t0, &resend);
  c.receive(2, hits({0, 1, 2}), t0, &resend);
  const ResponseList list = c.take_ready();
  CHECK(list.cache_ids == std::vector<std::int32_t>{3, 0});
  CHECK(list.hit == std::vector<std::int32_t>{7, 3});
  CHECK(list.responses.size() == 2);
  CHECK(list.evicted.empty());
  CHECK(resend.empty());
}

TEST_CASE("A full request for one id of a run takes that id out; the rest stay counted",
          "[coordinator][hits]") {
  Job job(2);
  Coordinator c(job.sets, 16, nullptr);
  const std::vector<std::int32_t> ids = warm(c, 2, {"a", "b", "c"});
  std::vector<std::int32_t> resend;
  c.receive(0, hits(ids), t0, &resend);                    // One run, 0-2.
  c.receive(1, full({allreduce("b", {4})}), t0, &resend);  // b as before, in full.
  c.receive(1, hits({0, 2}), t0, &resend);
  const ResponseList list = c.take_ready();
  // b re-cached under id 3 (evicting its old id), then the hits on 0 and on 2.
  CHECK(list.cache_ids == std::vector<std::int32_t>{3, 0, 2});
  CHECK(list.hit == std::vector<std::int32_t>{0, 1, 1});
  CHECK(list.evicted == std::vector<std::int32_t>{1});
  REQUIRE(list.responses.size() == 3);
  CHECK(list.responses[0].name == "b");
  CHECK(list.responses[0].ok);
}

TEST_CASE("Ids of a ready run evicted by the list that replays it are negotiated afresh",
          "[coordinator][hits][cache]") {
  // Capacity 3: d's insert evicts the least recently used of a, b, c (0, 1, 2), a, and e's
  // evicts b. Then a and b, negotiated again from the requests their ids stood for, are kept
  // out of the full cache (each was last used before c: Note [Cache admission] in
  // cache_admission.h) and go uncached; c is replayed.
  Job job(2);
  Coordinator c(job.sets, 3, nullptr);
  const std::vector<std::int32_t> ids = warm(c, 2, {"a", "b", "c"});
  std::vector<std::int32_t> resend;
  for (int r : {0, 1}) c.receive(r, full({allreduce("d", {1}), allreduce("e", {1})}), t0, &resend);
  for (int r : {0, 1}) c.receive(r, hits(ids), t0, &resend);
  const ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == 5);
  const std::vector<std::string> names = {"d", "e", "a", "b"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    CHECK(list.responses[i].name == names[i]);
    CHECK(list.responses[i].ok);
  }
  CHECK(list.responses[2].tensors[0].shape == Shape{4});
  CHECK(list.hit == std::vector<std::int32_t>{0, 0, 0, 0, 1});
  CHECK(list.cache_ids == std::vector<std::int32_t>{3, 4, -1, -1, 2});
  CHECK(list.evicted == std::vector<std::int32_t>{0, 1});
  CHECK_FALSE(c.has_ready());
}

TEST_CASE("An eviction inside a run still being counted sends that id to its name",
          "[coordinator][hits][cache]") {
  // Capacity 4: a, b, c (0-2) are cached; rank 0's hits on them are one run. d fits, then e's
  // insert evicts a, the least recently used.
  Job job(2);
  Coordinator c(job.sets, 4, nullptr);
  const std::vector<std::int32_t> ids = warm(c, 2, {"a", "b", "c"});
  std::vector<std::int32_t> resend;
  c.receive(0, hits(ids), t0, &resend);
  for (int r : {0, 1}) c.receive(r, full({allreduce("d", {1}), allreduce("e", {1})}), t0, &resend);
  const ResponseList first = c.take_ready();
  CHECK(first.cache_ids == std::vector<std::int32_t>{3, 4});
  CHECK(first.evicted == std::vector<std::int32_t>{0});
  // Rank 1 applied the eviction: a goes in full and finds rank 0's hit by name (its shape
  // differs, so the op fails, and nothing is cached to evict b or c); b and c are still
  // counted, and replayed.
  c.receive(1, full({allreduce("a", {5})}), t0, &resend);
  c.receive(1, hits({1, 2}), t0, &resend);
  const ResponseList second = c.take_ready();
  REQUIRE(second.responses.size() == 2);
  CHECK(second.responses[0].name == "a");
  CHECK(second.responses[0].error_message ==
        "Mismatched ALLREDUCE tensor shapes for 'a': rank 0 sent [4], rank 1 sent [5]");
  CHECK(second.hit == std::vector<std::int32_t>{0, 2});
  CHECK(second.cache_ids == std::vector<std::int32_t>{-1, 1});
  CHECK(second.evicted.empty());
  CHECK(resend.empty());
}

// What a rank knows of the response cache: the lists it executed (inserts, then evictions).
struct RankView {
  std::map<std::string, std::int32_t> id_of;  // The newest id of each name.
  std::map<std::int32_t, std::string> name_of;
};

TEST_CASE("Hits cut into random runs, with evictions and resends, complete every op once a step",
          "[coordinator][hits][cache]") {
  // Each step every rank submits the same ops in the same order, as hits where its view of the
  // cache has the name and in full otherwise, in batches cut at random; the batches of the
  // ranks interleave at random, and lists are taken at random points and applied to every
  // rank's view. A small capacity makes evictions (of counted and of ready runs) and resends:
  // a full cache too small for the names that recur soon settles, keeping every missed name out
  // (Notes [Cache admission] in cache_admission.h and [Settled cache] in response_cache.h), so
  // the recurring names change from kPhase on: the new phase's names get in once the old
  // phase's entries go stale, evicting them while the ranks still send hits on them. Each step
  // also has a name of its own.
  const int seed = GENERATE(range(0, 24));
  std::mt19937 random(static_cast<unsigned>(seed));
  const int size = 2 + seed % 3;
  const std::int64_t capacity =
      std::vector<std::int64_t>{6, 19, 64}[static_cast<std::size_t>(seed % 7 % 3)];
  constexpr int kOps = 25;
  constexpr int kNewOps = 1;
  constexpr int kSteps = 12;
  constexpr int kPhase = 4;
  Job job(size);
  Coordinator c(job.sets, capacity, nullptr);
  std::vector<RankView> views(static_cast<std::size_t>(size));
  std::vector<std::string> first;
  std::vector<std::string> second;
  for (int i = 0; i < kOps; ++i) {
    first.push_back("t" + std::to_string(i));
    second.push_back("u" + std::to_string(i));
  }
  int evictions = 0;
  int resends = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::string> names = step < kPhase ? first : second;
    for (int k = 0; k < kNewOps; ++k) {
      const auto at = static_cast<long>(random() % (names.size() + 1));
      names.insert(names.begin() + at, "s" + std::to_string(step) + "." + std::to_string(k));
    }
    std::map<std::string, int> sent;       // Ranks that sent each op this step.
    std::map<std::string, int> completed;  // Times each op completed this step.
    const auto take = [&] {
      const ResponseList list = c.take_ready();
      REQUIRE(list.hit.size() == list.responses.size());
      const auto complete = [&](const std::string& name) {
        CHECK(sent[name] == size);  // Never before every rank sent it.
        ++completed[name];
      };
      for (std::size_t i = 0; i < list.responses.size(); ++i) {
        for (std::int32_t k = 0; k < list.hit[i]; ++k) {
          const auto known = views[0].name_of.find(list.cache_ids[i] + k);
          REQUIRE(known != views[0].name_of.end());  // Every rank has the id it replays.
          complete(known->second);
        }
        if (list.hit[i] == 0) {
          CHECK(list.responses[i].ok);
          complete(list.responses[i].name.str());
        }
      }
      evictions += static_cast<int>(list.evicted.size());
      for (RankView& view : views) {  // Inserts, then evictions.
        for (std::size_t i = 0; i < list.responses.size(); ++i) {
          if (list.hit[i] != 0 || list.cache_ids[i] < 0) continue;
          view.name_of[list.cache_ids[i]] = list.responses[i].name;
          view.id_of[list.responses[i].name.str()] = list.cache_ids[i];
        }
        for (std::int32_t id : list.evicted) {
          const std::string name = view.name_of.at(id);
          view.name_of.erase(id);
          if (view.id_of.at(name) == id) view.id_of.erase(name);
        }
      }
    };
    // Each rank's batches: the ops in order, hits and requests, cut at random. What each hit
    // stands for, as the rank's queued entry knows it even once the id is evicted.
    std::vector<std::vector<RequestList>> batches(static_cast<std::size_t>(size));
    std::map<std::int32_t, std::string> hit_names;
    for (int r = 0; r < size; ++r) {
      const RankView& view = views[static_cast<std::size_t>(r)];
      RequestList batch;
      for (const std::string& name : names) {
        if (auto it = view.id_of.find(name); it != view.id_of.end()) {
          batch.cache_hits.push_back(it->second);
          hit_names[it->second] = name;
        } else {
          batch.requests.push_back(allreduce(name, {4}));
        }
        if (random() % 6 == 0)
          batches[static_cast<std::size_t>(r)].push_back(std::exchange(batch, {}));
      }
      batches[static_cast<std::size_t>(r)].push_back(std::move(batch));
      std::reverse(batches[static_cast<std::size_t>(r)].begin(),
                   batches[static_cast<std::size_t>(r)].end());
    }
    for (;;) {
      std::vector<int> left;
      for (int r = 0; r < size; ++r) {
        if (!batches[static_cast<std::size_t>(r)].empty()) left.push_back(r);
      }
      if (left.empty()) break;
      const int r = left[random() % left.size()];
      std::vector<RequestList>& mine = batches[static_cast<std::size_t>(r)];
      RequestList batch = std::move(mine.back());
      mine.pop_back();
      for (std::int32_t id : batch.cache_hits) ++sent[hit_names.at(id)];
      for (const Request& request : batch.requests) ++sent[request.name.str()];
      std::vector<std::int32_t> resend;
      c.receive(r, std::move(batch), t0, &resend);
      // Ids the coordinator no longer knows go again in full, next (as RequestSender does).
      if (!resend.empty()) {
        resends += static_cast<int>(resend.size());
        RequestList again;
        for (std::int32_t id : resend) {
          const std::string& name = hit_names.at(id);
          --sent[name];
          again.requests.push_back(allreduce(name, {4}));
        }
        mine.push_back(std::move(again));
      }
      if (random() % 3 == 0) take();
    }
    while (c.has_ready()) take();
    for (const std::string& name : names) {
      INFO("step " << step << ", op " << name);
      CHECK(completed[name] == 1);
    }
    // Every op answered: nothing is left pending, counted or kept for a list.
    INFO("step " << step);
    CHECK(c.empty());
  }
  // The paths this test is for were taken: with 64 entries all 2 * 25 + 12 * 1 names fit.
  static_assert(2 * kOps + kSteps * kNewOps <= 64);
  INFO("capacity " << capacity);
  if (capacity < kOps + kNewOps) {
    CHECK(evictions > 0);
    CHECK(resends > 0);
  } else {
    CHECK(evictions == 0);
  }
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
  CHECK(list.hit == std::vector<std::int32_t>{0});
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
  CHECK(list.hit == std::vector<std::int32_t>{0});
  CHECK(list.cache_ids == std::vector<std::int32_t>{a + 1});
  CHECK(list.evicted == std::vector<std::int32_t>{a});  // The name's old id.
  // The new id is counted again.
  for (int r : {0, 1}) c.receive(r, hits({a + 1}), t0, &resend);
  CHECK(c.take_ready().hit == std::vector<std::int32_t>{1});
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
  CHECK(released.hit == std::vector<std::int32_t>{0, 0});
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
  CHECK(c.take_ready().hit == std::vector<std::int32_t>{1});
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
  CHECK(list.hit == std::vector<std::int32_t>{0});
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
  CHECK(second.hit == std::vector<std::int32_t>{0});
  // Kept out of the full cache: a was last used before b (Note [Cache admission]).
  CHECK(second.cache_ids == std::vector<std::int32_t>{-1});
  CHECK(second.evicted.empty());
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
  // the requests its id stood for, and goes uncached: it was last used before b, so the full
  // cache keeps it out (Note [Cache admission]).
  const ResponseList list = c.take_ready();
  REQUIRE(list.responses.size() == 2);
  CHECK(list.responses[0].name == "b");
  CHECK(list.responses[1].name == "a");
  CHECK(list.responses[1].ok);
  CHECK(list.responses[1].tensors[0].shape == Shape{4});
  CHECK(list.hit == std::vector<std::int32_t>{0, 0});
  CHECK(list.cache_ids == std::vector<std::int32_t>{a + 1, -1});
  CHECK(list.evicted == std::vector<std::int32_t>{a});
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
  HitTable::Run& run = table.start(7, 3, 0, size, t0);
  int completed_at = -1;
  for (int r = size - 1; r >= 0; --r) {
    if (table.add(run, r)) completed_at = r;
    if (r == 64) {
      CHECK(run.has(129));
      CHECK(run.has(64));
      CHECK_FALSE(run.has(63));
      CHECK(run.members == size - 64);
    }
  }
  CHECK(completed_at == 0);
  const HitTable::Run taken = table.take(7);
  CHECK(taken.members == size);
  CHECK(taken.count == 3);
  CHECK(table.empty());
  HitTable::Run& next = table.start(8, 1, 0, 2, t0);
  CHECK(next.members == 0);
  CHECK_FALSE(next.has(0));
  CHECK_FALSE(table.add(next, 1));
  CHECK(table.add(next, 0));
}

TEST_CASE("Splitting a run and taking one id keep each part's members", "[hits]") {
  HitTable table;
  HitTable::Run& run = table.start(10, 10, 4, 3, t0);  // Ids 10-19 of set 4.
  CHECK_FALSE(table.add(run, 2));
  HitTable::Run& tail = table.split(run, 15);
  CHECK(run.first == 10);
  CHECK(run.count == 5);
  CHECK(tail.first == 15);
  CHECK(tail.count == 5);
  CHECK(tail.process_set_id == 4);
  CHECK(tail.has(2));
  CHECK(tail.members == 1);
  CHECK_FALSE(table.add(tail, 0));  // Counted on 15-19 only.
  CHECK_FALSE(table.find(12)->has(0));
  CHECK(table.find(17)->has(0));
  CHECK(table.find(9) == nullptr);
  CHECK(table.find(20) == nullptr);
  CHECK(table.find_from(9) == &run);
  CHECK(table.find_from(20) == nullptr);
  const HitTable::Run one = table.take_id(12);
  CHECK(one.first == 12);
  CHECK(one.count == 1);
  CHECK(one.has(2));
  CHECK(table.find(12) == nullptr);
  CHECK(table.find_from(12)->first == 13);
  CHECK(table.find(11)->count == 2);  // 10-11.
  CHECK(table.find(14)->count == 2);  // 13-14.
  std::vector<std::pair<std::int32_t, std::int32_t>> runs;
  table.for_each([&](const HitTable::Run& r) { runs.emplace_back(r.first, r.count); });
  CHECK(runs == std::vector<std::pair<std::int32_t, std::int32_t>>{{10, 2}, {13, 2}, {15, 5}});
}

TEST_CASE("The hit table counts like a table of ids under random runs", "[hits]") {
  // Against a map of id -> members' bits: runs started on free ids, members counted on any
  // stretch of pending ids (cut as the coordinator cuts them), single ids and whole runs taken.
  HitTable table;
  std::map<std::int32_t, std::uint64_t> reference;
  std::mt19937 random(12);
  constexpr int kSize = 5;
  constexpr std::int32_t kIds = 400;
  for (int round = 0; round < 3000; ++round) {
    const std::int32_t first = static_cast<std::int32_t>(random() % kIds);
    const std::int32_t count = 1 + static_cast<std::int32_t>(random() % 30);
    const std::int32_t end = std::min(kIds, first + count);
    switch (random() % 4) {
      case 0: {  // Start runs on the free ids of [first, end).
        for (std::int32_t id = first; id < end;) {
          if (reference.contains(id)) {
            ++id;
            continue;
          }
          std::int32_t stop = id;
          while (stop < end && !reference.contains(stop)) ++stop;
          table.start(id, stop - id, 0, kSize, t0);
          for (std::int32_t k = id; k < stop; ++k) reference[k] = 0;
          id = stop;
        }
        break;
      }
      case 1: {  // A member's hits on the pending ids of [first, end) that it has not sent.
        const int rank = static_cast<int>(random() % kSize);
        for (std::int32_t id = first; id < end; ++id) {
          HitTable::Run* run = table.find(id);
          if (run == nullptr || run->has(rank)) continue;
          if (run->first < id) run = &table.split(*run, id);
          if (run->count > 1) table.split(*run, id + 1);
          table.add(*run, rank);
          reference[id] |= std::uint64_t{1} << rank;
        }
        break;
      }
      case 2: {  // Take one id.
        if (!reference.contains(first)) break;
        const HitTable::Run one = table.take_id(first);
        CHECK(one.count == 1);
        CHECK(one.low == reference[first]);
        reference.erase(first);
        break;
      }
      default: {  // Take the run holding `first`, whole.
        const HitTable::Run* run = table.find(first);
        if (run == nullptr) break;
        const HitTable::Run taken = table.take(run->first);
        for (std::int32_t id = taken.first; id < taken.end(); ++id) {
          REQUIRE(reference.contains(id));
          CHECK(reference[id] == taken.low);
          reference.erase(id);
        }
      }
    }
    if (round % 50 == 0) {
      for (std::int32_t id = 0; id < kIds; ++id) {
        const HitTable::Run* run = table.find(id);
        REQUIRE((run != nullptr) == reference.contains(id));
        if (run == nullptr) continue;
        CHECK(run->first <= id);
        CHECK(id < run->end());
        CHECK(run->low == reference[id]);
        CHECK(run->members == std::popcount(run->low));
      }
    }
  }
  CHECK(table.empty() == reference.empty());
}

}  // namespace
}  // namespace tutti::core
