// SPDX-License-Identifier: Apache-2.0
#include "src/core/response_cache.h"

#include <list>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/core/negotiation_fixtures.h"

namespace tutti::core {
namespace {

using test::named;

CoordinatorCache::Entry entry(const std::string& name) {
  CoordinatorCache::Entry e;
  e.name = name;
  e.requests = {std::make_shared<const Request>(named(name))};
  e.response.name = name;
  return e;
}

TEST_CASE("The coordinator cache evicts the least recently used beyond its capacity", "[cache]") {
  CoordinatorCache cache(2);
  std::vector<std::int32_t> evicted;
  const std::int32_t a = cache.insert(entry("a"), &evicted);
  const std::int32_t b = cache.insert(entry("b"), &evicted);
  CHECK(evicted.empty());
  REQUIRE(cache.find(a) != nullptr);  // a is now the most recent.
  const std::int32_t c = cache.insert(entry("c"), &evicted);
  CHECK(evicted == std::vector<std::int32_t>{b});
  CHECK(cache.find(b) == nullptr);
  CHECK(cache.find(c)->name == "c");
  CHECK(cache.size() == 2);
}

TEST_CASE("The coordinator cache's use_set() names the set and counts as a use; get() does not",
          "[cache]") {
  CoordinatorCache cache(2);
  std::vector<std::int32_t> evicted;
  CoordinatorCache::Entry of_set_3 = entry("a");
  of_set_3.process_set_id = 3;
  const std::int32_t a = cache.insert(std::move(of_set_3), &evicted);
  const std::int32_t b = cache.insert(entry("b"), &evicted);
  CHECK(cache.use_set(a) == std::optional<int>(3));
  CHECK(cache.use_set(b) == std::optional<int>(0));
  CHECK(cache.use_set(b + 1) == std::nullopt);
  CHECK(cache.get(b + 1) == nullptr);
  // b, then a, used last (a was inserted first: only its use makes it the more recent); get(b)
  // changes nothing, so b is the least recent and goes first.
  REQUIRE(cache.use_set(b));
  REQUIRE(cache.use_set(a));
  REQUIRE(cache.get(b)->name == "b");
  cache.insert(entry("c"), &evicted);
  CHECK(evicted == std::vector<std::int32_t>{b});
  CHECK(cache.get(b) == nullptr);
  CHECK(cache.use_set(b) == std::nullopt);
}

// A reference model of the coordinator cache's eviction order: ids, most recently used first.
struct LruModel {
  std::list<std::int32_t> order;
  void use(std::int32_t id) {
    order.remove(id);
    order.push_front(id);
  }
};

TEST_CASE("The coordinator cache evicts in exact least-recently-used order", "[cache]") {
  // Random inserts (of new and of cached names), finds and set removals, against a list moved
  // in order of use. Capacity 5 of 9 names: most inserts evict.
  constexpr int kCapacity = 5;
  CoordinatorCache cache(kCapacity);
  LruModel model;
  std::map<std::int32_t, std::string> names;  // Live ids in the model.
  std::mt19937 random(7);
  std::vector<std::int32_t> evicted;
  for (int step = 0; step < 20000; ++step) {
    const int what = static_cast<int>(random() % 10);
    if (what < 4) {
      const std::string name = "n" + std::to_string(random() % 9);
      std::vector<std::int32_t> expected;
      // The same name's old id first, then the least recently used while full.
      for (const auto& [id, known] : names) {
        if (known == name) expected.push_back(id);
      }
      for (std::int32_t id : expected) {
        model.order.remove(id);
        names.erase(id);
      }
      while (static_cast<int>(model.order.size()) >= kCapacity) {
        expected.push_back(model.order.back());
        names.erase(model.order.back());
        model.order.pop_back();
      }
      evicted.clear();
      const std::int32_t id = cache.insert(entry(name), &evicted);
      REQUIRE(evicted == expected);
      model.use(id);
      names[id] = name;
    } else if (!names.empty()) {
      auto live = names.begin();
      std::advance(live, static_cast<long>(random() % names.size()));
      const CoordinatorCache::Entry* found = cache.find(live->first);
      REQUIRE(found != nullptr);
      CHECK(found->name == live->second);
      model.use(live->first);
    }
    REQUIRE(cache.size() == names.size());
  }
  // Evicted ids stay unknown.
  for (std::int32_t id = 0; id < 100; ++id) {
    if (!names.contains(id)) CHECK(cache.find(id) == nullptr);
  }
}

TEST_CASE("The coordinator cache's eviction order stays bounded in memory", "[cache]") {
  // Renegotiating the same names over and over evicts nothing for capacity: the records of
  // their old ids must not pile up.
  CoordinatorCache cache(1000);
  std::vector<std::int32_t> evicted;
  for (int round = 0; round < 100000; ++round) {
    const std::int32_t id = cache.insert(entry("n" + std::to_string(round % 4)), &evicted);
    REQUIRE(cache.find(id) != nullptr);
  }
  CHECK(cache.size() == 4);
  CHECK(evicted.size() == 100000 - 4);
  // Twice the live ids plus the slack the cache allows itself (response_cache.h).
  CHECK(cache.age_records() <= 2 * 4 + 1024 + 1);
  // And the order is still right: fill up to the capacity, use the first, insert one more.
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 996; ++i)
    ids.push_back(cache.insert(entry("m" + std::to_string(i)), &evicted));
  evicted.clear();
  cache.take_evicted();
  REQUIRE(cache.find(ids.front()) != nullptr);
  cache.insert(entry("last"), &evicted);
  // The four renegotiated names were used before any "m": the oldest of them goes first.
  REQUIRE(evicted.size() == 1);
  const auto gone = cache.take_evicted();
  REQUIRE(gone.size() == 1);
  CHECK(gone.front()->name == "n0");
}

// One step of `names` ops named "<prefix><i>", as the coordinator meets them: a cached name is
// a hit (marked used), any other is negotiated and inserted. Returns the step's inserts.
int run_step(CoordinatorCache& cache, int names, const std::string& prefix = "op") {
  std::vector<std::int32_t> evicted;
  int inserts = 0;
  for (int i = 0; i < names; ++i) {
    const std::string name = prefix + std::to_string(i);
    if (const std::optional<std::int32_t> id = cache.id_of(OpKeyView{0, name})) {
      REQUIRE(cache.find(*id) != nullptr);
    } else {
      cache.insert(entry(name), &evicted);
      ++inserts;
    }
    cache.take_evicted();
  }
  return inserts;
}

TEST_CASE("A cache too small for the names that recur says so once, with how many recur",
          "[cache][thrash]") {
  // 300 names a step in a cache of 64: least-recently-used evicts each name 64 inserts after
  // it went in, and it comes back 300 inserts after that insert, so every op misses and the
  // names recur among exactly 300 (Note [Cache thrash]).
  CoordinatorCache cache(64);
  CHECK(run_step(cache, 300) == 300);
  int steps = 1;
  std::optional<CacheThrashWatch::Report> report;
  while (!report && steps < 5) {
    CHECK(run_step(cache, 300) == 300);
    ++steps;
    report = cache.take_thrash_report();
  }
  REQUIRE(report.has_value());
  CHECK(steps == 2);  // The second step's 64th returning name makes it due.
  CHECK(report->capacity == 64);
  CHECK(report->recurrences == 64);
  CHECK(report->distance == 300);
  const std::string text = describe(*report);
  CHECK_THAT(text, Catch::Contains("TUTTI_CACHE_CAPACITY=64"));
  CHECK_THAT(text, Catch::Contains("at least 300"));
  for (int more = 0; more < 3; ++more) {
    run_step(cache, 300);
    CHECK_FALSE(cache.take_thrash_report().has_value());  // Once.
  }
}

TEST_CASE("A cache with room, or names that never come back, reports nothing", "[cache][thrash]") {
  SECTION("the names fit") {
    CoordinatorCache cache(64);
    CHECK(run_step(cache, 64) == 64);
    for (int step = 0; step < 5; ++step) CHECK(run_step(cache, 64) == 0);  // All hits.
    CHECK_FALSE(cache.take_thrash_report().has_value());
  }
  SECTION("every name is new") {
    CoordinatorCache cache(64);
    for (int step = 0; step < 50; ++step) run_step(cache, 300, "step" + std::to_string(step) + ".");
    CHECK_FALSE(cache.take_thrash_report().has_value());
  }
  SECTION("a few names come back, fewer than the capacity") {
    CoordinatorCache cache(64);
    for (int step = 0; step < 50; ++step) {
      run_step(cache, 300, "step" + std::to_string(step) + ".");
      run_step(cache, 1, "again");  // Evicted each step and negotiated again: one recurrence.
    }
    CHECK_FALSE(cache.take_thrash_report().has_value());
  }
}

TEST_CASE("The thrash watch forgets the oldest evictions beyond its bound", "[cache][thrash]") {
  CacheThrashWatch watch(4);
  const std::size_t bound = CacheThrashWatch::kMinRemembered;
  for (std::size_t i = 0; i < 3 * bound; ++i) {
    const std::string name = "gone" + std::to_string(i);
    watch.evicted_for_room(OpKeyView{0, name});
    CHECK_FALSE(watch.inserted(OpKeyView{0, "new" + std::to_string(i)}).has_value());
  }
  CHECK(watch.remembered() == bound);
  // The first evictions are forgotten: their names coming back are not recurrences.
  for (std::size_t i = 0; i < 8; ++i) {
    const std::string name = "gone" + std::to_string(i);
    CHECK_FALSE(watch.inserted(OpKeyView{0, name}).has_value());
  }
  CHECK(watch.remembered() == bound);
  // The latest are remembered: four of them coming back make the report due (capacity 4).
  std::optional<CacheThrashWatch::Report> report;
  for (std::size_t i = 3 * bound - 4; i < 3 * bound; ++i) {
    report = watch.inserted(OpKeyView{0, "gone" + std::to_string(i)});
  }
  REQUIRE(report.has_value());
  CHECK(report->recurrences == 4);
  CHECK(watch.remembered() == 0);  // Done: nothing kept after the report.
}

TEST_CASE("Re-negotiating a name evicts its old id; ids are never reused", "[cache]") {
  CoordinatorCache cache(10);
  std::vector<std::int32_t> evicted;
  const std::int32_t first = cache.insert(entry("a"), &evicted);
  const std::int32_t second = cache.insert(entry("a"), &evicted);
  CHECK(second != first);
  CHECK(evicted == std::vector<std::int32_t>{first});
  CHECK(cache.find(first) == nullptr);
}

TEST_CASE("The rank cache answers only identical requests", "[cache]") {
  RankCache cache;
  Request request = named("w");
  request.tensors = {TensorSpec{.dtype = DataType::Float32, .shape = {3}}};
  Response response;
  response.name = "w";
  cache.insert(7, request, response);
  CHECK(cache.lookup(request) == std::optional<std::int32_t>(7));
  Request other = request;
  other.tensors[0].shape = {4};
  CHECK_FALSE(cache.lookup(other).has_value());
  REQUIRE(cache.response(7) != nullptr);
  cache.erase(7);
  CHECK_FALSE(cache.lookup(request).has_value());
  CHECK(cache.response(7) == nullptr);
}

TEST_CASE("The rank cache tells a request from the cached one by any field but its key",
          "[cache]") {
  // One change to each field of Request; a rank sends the cache id only for an identical
  // request, whether it finds the id by name (lookup()) or tries the id it expects (matches()).
  Request base = named("w");
  base.tensors = {TensorSpec{.dtype = DataType::Float32, .shape = {3, 2}}};
  base.splits = {1, 2};
  base.set_ranks = {0, 1};
  const std::vector<void (*)(Request&)> changes = {
      [](Request& r) { r.op = Collective::Broadcast; },
      [](Request& r) { r.device = Device::Kind::CUDA; },
      [](Request& r) { r.reduce_op = ReduceOp::Max; },
      [](Request& r) { r.prescale = 0.5; },
      [](Request& r) { r.postscale = 2.0; },
      [](Request& r) { r.root_rank = 1; },
      [](Request& r) {
        r.splits = {2, 1};
      },
      [](Request& r) { r.splits.clear(); },
      [](Request& r) { r.tensors[0].dtype = DataType::Float64; },
      [](Request& r) {
        r.tensors[0].shape = {2, 3};
      },
      [](Request& r) {
        r.tensors[0].shape = {3, 2, 1};
      },
      [](Request& r) {
        r.tensors[0].shape = {3, 2, 1, 1, 1};
      },  // Past the in-place dims.
      [](Request& r) { r.tensors.push_back(r.tensors[0]); },
      [](Request& r) { r.tensors.clear(); },
      [](Request& r) { r.set_ranks = {1}; },
      [](Request& r) { r.target_set_id = 3; },
  };
  RankCache cache;
  cache.insert(7, base, Response{});
  const auto hash_of = [](const Request& r) {
    return name_hash(OpKeyView{r.process_set_id, r.name});
  };
  CHECK(cache.lookup(base) == std::optional<std::int32_t>(7));
  CHECK(cache.matches(7, base, hash_of(base)));
  CHECK_FALSE(cache.matches(8, base, hash_of(base)));  // Not cached.
  CHECK(equal_but_key(base, base));
  for (std::size_t i = 0; i < changes.size(); ++i) {
    Request changed = base;
    changes[i](changed);
    INFO("change " << i);
    CHECK_FALSE(changed == base);
    CHECK_FALSE(equal_but_key(changed, base));
    CHECK_FALSE(cache.lookup(changed).has_value());
    CHECK_FALSE(cache.matches(7, changed, hash_of(changed)));
  }
  // The key is the index's to compare: another name or set is another entry.
  Request renamed = base;
  renamed.name = "v";
  renamed.process_set_id = 2;
  CHECK(equal_but_key(renamed, base));
  CHECK_FALSE(cache.lookup(renamed).has_value());
  CHECK_FALSE(cache.matches(7, renamed, hash_of(renamed)));
  // matches() compares the key itself too, not only the hash it is given.
  CHECK_FALSE(cache.matches(7, renamed, hash_of(base)));
  renamed.process_set_id = base.process_set_id;
  CHECK_FALSE(cache.matches(7, renamed, hash_of(base)));
  renamed = base;
  renamed.process_set_id = 2;
  CHECK_FALSE(cache.matches(7, renamed, hash_of(base)));
  cache.erase(7);
  CHECK_FALSE(cache.matches(7, base, hash_of(base)));
}

TEST_CASE("The rank cache hands back a response's facts and name hash with it", "[cache]") {
  RankCache cache;
  Request request = named("w");
  Response response;
  response.name = "w";
  cache.insert(3, request, response, ResponseFacts{.fusion_key = 42, .fusion_bytes = 12});
  cache.insert(4, named("v"), response);  // No facts given.
  ResponseFacts facts;
  std::uint64_t hash = 0;
  REQUIRE(cache.response(3, &hash, &facts) != nullptr);
  CHECK(facts.fusion_key == 42);
  CHECK(facts.fusion_bytes == 12);
  CHECK(hash == name_hash(OpKeyView{request.process_set_id, request.name}));
  // The default fuses with nothing: key 0, and more bytes than any threshold.
  REQUIRE(cache.response(4, nullptr, &facts) != nullptr);
  CHECK(facts.fusion_key == 0);
  CHECK(facts.fusion_bytes == SIZE_MAX);
}

}  // namespace
}  // namespace tutti::core
