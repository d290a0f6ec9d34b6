// SPDX-License-Identifier: Apache-2.0
#include "src/core/response_cache.h"

#include <algorithm>
#include <map>
#include <optional>
#include <ostream>
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

// A reference model of the coordinator cache of fixed capacity: least-recently-used eviction,
// the admission rule of Note [Cache admission] and the report of Note [Cache thrash] in
// cache_admission.h, and Note [Settled cache] in response_cache.h, on a clock that ticks once per
// use and once per insert, as the cache's does. Names are remembered for good (the test makes
// fewer misses than the admission's memory holds).
struct CacheModel {
  struct Gone {
    std::uint64_t used = 0;  // Last use, or the miss that kept it out.
    std::uint64_t left = 0;  // The admission's misses when it left or was kept out.
  };
  std::size_t capacity = 0;
  std::uint64_t clock = 0;
  std::map<std::int32_t, std::string> names;       // Live ids.
  std::map<std::int32_t, std::uint64_t> last_use;  // Of live ids.
  std::map<std::string, Gone> gone;                // Names evicted for room or kept out.
  std::int32_t next_id = 0;
  std::uint64_t misses = 0;  // Names the admission was asked about.
  std::uint64_t recurrences = 0;
  std::uint64_t distance = 0;
  std::uint64_t stale_after = 0;  // 0 until the report.
  bool settled = false;
  std::uint64_t kept_out = 0;  // By the admission, since the cache last unsettled.
  int settlings = 0;
  int unsettlings = 0;

  void use(std::int32_t id) { last_use[id] = ++clock; }
  // The ids insert(name) evicts, in order, and the id it returns (-1 if kept out).
  std::pair<std::vector<std::int32_t>, std::int32_t> insert(const std::string& name) {
    std::vector<std::int32_t> evicted;
    for (const auto& [id, known] : names) {
      if (known == name) evicted.push_back(id);
    }
    for (std::int32_t id : evicted) drop(id);
    const std::uint64_t now = ++clock;
    if (names.size() >= capacity) {
      const auto oldest =
          std::min_element(last_use.begin(), last_use.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
      const std::uint64_t lru = oldest->second;
      if (settled) {
        if (now - lru <= stale_after) return {evicted, -1};  // Unasked.
        settled = false;
        kept_out = 0;
        ++unsettlings;
      }
      ++misses;
      if (auto was = gone.find(name); was != gone.end()) {
        recurred(was->second.left);
        if (was->second.used < lru) {
          was->second = Gone{.used = now, .left = misses};
          if (stale_after > 0 && ++kept_out >= capacity && now - lru <= stale_after) settle();
          return {evicted, -1};
        }
      }
      evicted.push_back(oldest->first);
      gone[names[oldest->first]] = Gone{.used = lru, .left = misses};
      drop(oldest->first);
    } else {
      ++misses;
      if (auto was = gone.find(name); was != gone.end()) recurred(was->second.left);
    }
    gone.erase(name);
    const std::int32_t id = next_id++;
    names[id] = name;
    last_use[id] = now;
    return {evicted, id};
  }
  void drop(std::int32_t id) {
    names.erase(id);
    last_use.erase(id);
  }
  // A remembered name missed again: the report is due at the capacity's count of them, and
  // settles the cache.
  void recurred(std::uint64_t left) {
    if (stale_after > 0) return;  // Reported.
    distance = std::max(distance, misses - left + capacity);
    if (++recurrences < capacity) return;
    stale_after = 2 * distance;
    settle();
  }
  void settle() {
    settled = true;
    ++settlings;
  }
};

TEST_CASE("The coordinator cache evicts least recently used and admits as its model says",
          "[cache]") {
  // Random inserts (of new, cached and departed names) and finds, against the reference model.
  // Capacity 5 of 9 names: most inserts evict, or are kept out.
  constexpr int kCapacity = 5;
  CoordinatorCache cache(kCapacity);
  CacheModel model;
  model.capacity = kCapacity;
  std::mt19937 random(7);
  std::vector<std::int32_t> evicted;
  int kept_out = 0;
  int evictions_for_room = 0;
  for (int step = 0; step < 20000; ++step) {
    const int what = static_cast<int>(random() % 10);
    if (what < 4) {
      const std::string name = "n" + std::to_string(random() % 9);
      const bool cached =
          std::ranges::any_of(model.names, [&](const auto& live) { return live.second == name; });
      const auto [expected, expected_id] = model.insert(name);
      evicted.clear();
      const std::int32_t id = cache.insert(entry(name), &evicted);
      REQUIRE(evicted == expected);
      REQUIRE(id == expected_id);
      REQUIRE(cache.settled() == model.settled);
      kept_out += id < 0 ? 1 : 0;
      evictions_for_room += static_cast<int>(expected.size()) - (cached ? 1 : 0);
    } else if (!model.names.empty()) {
      auto live = model.names.begin();
      std::advance(live, static_cast<long>(random() % model.names.size()));
      const CoordinatorCache::Entry* found = cache.find(live->first);
      REQUIRE(found != nullptr);
      CHECK(found->name == live->second);
      model.use(live->first);
    }
    REQUIRE(cache.size() == model.names.size());
  }
  // Both ways of a full cache were taken, many times, and it settled and unsettled often.
  CHECK(kept_out > 500);
  CHECK(evictions_for_room > 200);
  CHECK(model.settlings > 100);
  CHECK(model.unsettlings > 100);
  // Evicted ids stay unknown.
  for (std::int32_t id = 0; id < 100; ++id) {
    if (!model.names.contains(id)) CHECK(cache.find(id) == nullptr);
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

// What one step did in the cache.
struct StepCount {
  int hits = 0;
  int inserts = 0;
  int kept_out = 0;
  int evicted = 0;
  friend bool operator==(const StepCount&, const StepCount&) = default;
  friend std::ostream& operator<<(std::ostream& out, const StepCount& count) {
    return out << "{hits " << count.hits << ", inserts " << count.inserts << ", kept out "
               << count.kept_out << ", evicted " << count.evicted << "}";
  }
};

// One step of `names` ops named "<prefix><i>", as the coordinator meets them: a cached name is
// a hit (marked used), any other is negotiated and offered to the cache.
StepCount run_step(CoordinatorCache& cache, int names, const std::string& prefix = "op") {
  StepCount count;
  std::vector<std::int32_t> evicted;
  for (int i = 0; i < names; ++i) {
    const std::string name = prefix + std::to_string(i);
    if (const std::optional<std::int32_t> id = cache.id_of(OpKeyView{0, name})) {
      REQUIRE(cache.find(*id) != nullptr);
      ++count.hits;
    } else if (cache.insert(entry(name), &evicted) >= 0) {
      ++count.inserts;
    } else {
      ++count.kept_out;
    }
    cache.take_evicted();
  }
  count.evicted = static_cast<int>(evicted.size());
  return count;
}

TEST_CASE("A cache too small for the names that recur keeps a capacity's worth and says so once",
          "[cache][thrash]") {
  // 300 names a step in a cache of 64. The first step inserts all 300, each evicting the least
  // recently used once the cache is full, and ends holding names 236-299. From the second step
  // on every evicted name was last used before every cached one, so it is kept out (Note [Cache
  // admission]): names 236-299 hit, 0-235 are negotiated in full, and nothing is evicted. Name
  // k < 64 was evicted at miss k + 65 and comes back at miss k + 301: the names recur among
  // exactly 300 (Note [Cache thrash]).
  CoordinatorCache cache(64);
  const StepCount first = run_step(cache, 300);
  CHECK(first.inserts == 300);
  CHECK(first.evicted == 300 - 64);
  CHECK_FALSE(cache.take_thrash_report().has_value());
  const StepCount second = run_step(cache, 300);
  CHECK(second.hits == 64);
  CHECK(second.kept_out == 300 - 64);
  CHECK(second.inserts == 0);
  CHECK(second.evicted == 0);
  const std::optional<CacheAdmission::Report> report = cache.take_thrash_report();
  REQUIRE(report.has_value());  // The second step's 64th returning name made it due.
  CHECK(report->capacity == 64);
  CHECK(report->recurrences == 64);
  CHECK(report->distance == 300);
  const std::string text = describe(*report);
  CHECK_THAT(text, Catch::Contains("TUTTI_CACHE_CAPACITY=64"));
  CHECK_THAT(text, Catch::Contains("at least 300"));
  for (int more = 0; more < 3; ++more) {
    const StepCount step = run_step(cache, 300);
    CHECK(step.hits == 64);  // The same 64, every step.
    CHECK(step.evicted == 0);
    CHECK_FALSE(cache.take_thrash_report().has_value());  // Once.
  }
}

TEST_CASE("A settled cache takes a new phase's names two of the old phase's steps later",
          "[cache][thrash]") {
  // A step of 300 names is 300 stamps (a hit or a miss each). Phase a settles as above: the
  // report in its second step (distance 300) settles the cache with stale_after 600 (Note
  // [Settled cache]), a236-a299 cached, used at stamps 837-900 in a's third step.
  CoordinatorCache cache(64);
  for (int step = 0; step < 3; ++step) run_step(cache, 300, "a");
  REQUIRE(cache.settled());
  // b's names are new, but settled, the cache keeps them out unasked while a236 (its least
  // recently used) was used within 600 stamps: at b_k's stamp 901 + k, 64 + k ago.
  CHECK(run_step(cache, 300, "b") == StepCount{.kept_out = 300});
  CHECK(cache.settled());
  // In b's second step a236 is 364 + k stamps old: b237 finds it stale, unsettles the cache and
  // gets in (new to the admission), as do b238-b299, each evicting the least recently used a name.
  CHECK(run_step(cache, 300, "b") == StepCount{.inserts = 63, .kept_out = 237, .evicted = 63});
  CHECK_FALSE(cache.settled());
  // b0-b236 were never remembered (a settled cache asks nothing): all get in, b0 evicting a299,
  // b1-b63 evicting b237-b299 before they are reached, b64-b236 each other (b0-b172);
  // b237-b299, remembered as they left, are older than the b names cached by then: kept out.
  // 63 kept out: not yet settled again.
  CHECK(run_step(cache, 300, "b") == StepCount{.inserts = 237, .kept_out = 63, .evicted = 237});
  CHECK_FALSE(cache.settled());
  // b0 is the 64th name kept out, with b173 (the least recently used) fresh: settled again,
  // b173-b236 hit from now on.
  for (int step = 0; step < 2; ++step) {
    CHECK(run_step(cache, 300, "b") == StepCount{.hits = 64, .kept_out = 236});
    CHECK(cache.settled());
  }
  // a comes back: kept out unasked (b173 is fresh) for a step; in the next, b173 goes stale at
  // a174, which unsettles the cache, and a174-a299 are asked: remembered as used long before
  // b173, kept out, remembered as used now. The cached b names stay stale: no settling.
  CHECK(run_step(cache, 300, "a") == StepCount{.kept_out = 300});
  CHECK(run_step(cache, 300, "a") == StepCount{.kept_out = 300});
  CHECK_FALSE(cache.settled());
  // Now a174-a237 were used after the b names: they get in, evicting b173-b236; a238 on and
  // a0-a173 are kept out, and the cache settles with a174-a237 fresh. From the step after, they
  // hit.
  CHECK(run_step(cache, 300, "a") == StepCount{.inserts = 64, .kept_out = 236, .evicted = 64});
  CHECK(cache.settled());
  CHECK(run_step(cache, 300, "a") == StepCount{.hits = 64, .kept_out = 236});
  // Phase b's cached names are all gone, and b is kept out while a's are fresh.
  CHECK(run_step(cache, 300, "b") == StepCount{.kept_out = 300});
}

TEST_CASE("A cache that can grow does not settle; one that stops growing does", "[cache][thrash]") {
  // Growth starts the admission afresh (Note [Cache growth]); only the report at the limit settles.
  CoordinatorCache grows(64, 1024);
  for (int step = 0; step < 3; ++step) run_step(grows, 300);
  CHECK_FALSE(grows.settled());
  CHECK(grows.capacity() == 375);
  CHECK(run_step(grows, 300).hits == 300);
  CoordinatorCache limited(64, 100);
  for (int step = 0; step < 8; ++step) run_step(limited, 300);
  CHECK(limited.settled());
}

TEST_CASE("A cache with room, or names that never come back, reports nothing", "[cache][thrash]") {
  SECTION("the names fit") {
    CoordinatorCache cache(64);
    CHECK(run_step(cache, 64).inserts == 64);
    for (int step = 0; step < 5; ++step) CHECK(run_step(cache, 64).hits == 64);
    CHECK_FALSE(cache.take_thrash_report().has_value());
  }
  SECTION("every name is new") {
    CoordinatorCache cache(64);
    for (int step = 0; step < 50; ++step) {
      const StepCount count = run_step(cache, 300, "step" + std::to_string(step) + ".");
      CHECK(count.inserts == 300);  // New names always get in.
    }
    CHECK_FALSE(cache.take_thrash_report().has_value());
  }
  SECTION("a few names come back, fewer than the capacity") {
    CoordinatorCache cache(64);
    for (int step = 0; step < 50; ++step) {
      run_step(cache, 300, "step" + std::to_string(step) + ".");
      run_step(cache, 1, "again");  // Gone each step and negotiated again: one recurrence.
    }
    CHECK_FALSE(cache.take_thrash_report().has_value());
  }
}

TEST_CASE("A cache that may grow grows to fit the names that recur, and reports nothing",
          "[cache][growth]") {
  // As above, 300 names a step in 64 entries, but the cache may grow to 1024 (Note [Cache
  // growth]). The second step keeps names 0-63 out, as a fixed cache would; the 64th of them
  // makes the report due (distance 300), and the cache grows to max(2 * 64, 300 + 300 / 4) =
  // 375 with a fresh admission memory. Names 64-235 are then new to it and get in without
  // evicting (64 + 172 = 236 entries), and 236-299 hit. The third step inserts 0-63 (300
  // entries); from the fourth, every name hits.
  CoordinatorCache cache(64, 1024);
  CHECK(run_step(cache, 300).inserts == 300);
  CHECK_FALSE(cache.take_growth().has_value());
  const StepCount second = run_step(cache, 300);
  CHECK(second.kept_out == 64);
  CHECK(second.inserts == 300 - 64 - 64);
  CHECK(second.hits == 64);
  CHECK(second.evicted == 0);
  const std::optional<CoordinatorCache::Growth> growth = cache.take_growth();
  REQUIRE(growth.has_value());
  CHECK(growth->from == 64);
  CHECK(growth->to == 375);
  CHECK(growth->distance == 300);
  CHECK(cache.capacity() == 375);
  const StepCount third = run_step(cache, 300);
  CHECK(third.inserts == 64);
  CHECK(third.hits == 300 - 64);
  CHECK(third.evicted == 0);
  for (int step = 0; step < 3; ++step) {
    const StepCount settled = run_step(cache, 300);
    CHECK(settled.hits == 300);
    CHECK(settled.evicted == 0);
  }
  CHECK_FALSE(cache.take_growth().has_value());  // Once: it fits now.
  CHECK_FALSE(cache.take_thrash_report().has_value());
  CHECK(cache.capacity() == 375);
}

TEST_CASE("A cache that grew to its limit keeps that many names and says so once",
          "[cache][growth]") {
  // 300 names a step, 64 entries growing to 100 at most: the first report grows the cache to
  // min(100, 375); once the names settle, 100 hit each step, the other 200 are kept out, and the
  // second report goes to the user, naming the limit rather than TUTTI_CACHE_CAPACITY.
  CoordinatorCache cache(64, 100);
  std::vector<CacheAdmission::Report> reports;
  std::vector<CoordinatorCache::Growth> growths;
  for (int step = 0; step < 8; ++step) {
    run_step(cache, 300);
    if (std::optional<CacheAdmission::Report> report = cache.take_thrash_report())
      reports.push_back(*report);
    if (std::optional<CoordinatorCache::Growth> growth = cache.take_growth())
      growths.push_back(*growth);
  }
  REQUIRE(growths.size() == 1);
  CHECK(growths.front().from == 64);
  CHECK(growths.front().to == 100);
  CHECK(cache.capacity() == 100);
  REQUIRE(reports.size() == 1);
  CHECK(reports.front().capacity == 100);
  CHECK(reports.front().grown);
  CHECK(reports.front().distance >= 300);
  const std::string text = describe(reports.front());
  CHECK_THAT(text, Catch::Contains("100 entries, the most it grows to"));
  CHECK_THAT(text, !Catch::Contains("TUTTI_CACHE_CAPACITY=100"));
  for (int step = 0; step < 2; ++step) {
    const StepCount settled = run_step(cache, 300);
    CHECK(settled.hits == 100);
    CHECK(settled.kept_out == 200);
    CHECK(settled.evicted == 0);
  }
}

TEST_CASE("The cache grows only while TUTTI_CACHE_CAPACITY is unset, by the job's size",
          "[cache][growth]") {
  // kGrownRequests = 131072 requests' worth, within the capacity and kMaxGrownCapacity = 65536.
  CHECK(cache_growth_limit(1024, true, 2) == 1024);  // Set: never grows.
  CHECK(cache_growth_limit(4096, true, 64) == 4096);
  CHECK(cache_growth_limit(0, false, 2) == 0);  // Off stays off.
  CHECK(cache_growth_limit(1024, false, 1) == 65536);
  CHECK(cache_growth_limit(1024, false, 2) == 65536);
  CHECK(cache_growth_limit(1024, false, 4) == 32768);
  CHECK(cache_growth_limit(1024, false, 8) == 16384);
  CHECK(cache_growth_limit(1024, false, 64) == 2048);
  CHECK(cache_growth_limit(1024, false, 256) == 1024);  // 512 requests' worth: no growth.
  CHECK(cache_growth_limit(100000, false, 2) == 100000);
}

std::uint64_t hash_of(const std::string& name) { return name_hash(OpKeyView{0, name}); }

TEST_CASE("Cache admission forgets a name the bound's count of misses after it left",
          "[cache][thrash]") {
  // Capacity 4: the bound is kMinRemembered misses. Name "gone<i>" leaves at miss i + 1 (evicted
  // for "new<i>"), so at miss m it is remembered while m - (i + 1) < bound.
  CacheAdmission admission(4);
  const std::uint64_t bound = CacheAdmission::kMinRemembered;
  std::uint64_t clock = 0;
  std::uint64_t misses = 0;
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t used = ++clock;  // The entry evicted for it was last used then.
    CHECK(admission.admits(hash_of("new" + std::to_string(i)), used, ++clock));
    ++misses;
    admission.evicted_for_room(hash_of("gone" + std::to_string(i)), used);
  }
  CHECK(admission.remembered() == 1000);
  // Misses of new names while the cache has room, up to miss bound + 500: "gone0" to "gone499"
  // left at misses 1 to 500, bound or more misses ago.
  while (misses < bound + 500) {
    CHECK(admission.admits(hash_of("room" + std::to_string(misses)), std::nullopt, ++clock));
    ++misses;
  }
  CHECK(admission.remembered() == 500);
  const std::uint64_t lru_used = ++clock;  // Used after every departure.
  // Miss bound + 501: "gone0" is forgotten, so new to it: in.
  CHECK(admission.admits(hash_of("gone0"), lru_used, ++clock));
  // Miss bound + 502: "gone999" (left at miss 1000) is remembered, last used before the cache's
  // least recent use: kept out.
  CHECK_FALSE(admission.admits(hash_of("gone999"), lru_used, ++clock));
  // Misses bound + 503 and + 504, at the edge: "gone502" left at miss 503, exactly bound misses
  // before (forgotten); "gone504" at miss 505, one fewer (remembered).
  CHECK(admission.admits(hash_of("gone502"), lru_used, ++clock));
  CHECK_FALSE(admission.admits(hash_of("gone504"), lru_used, ++clock));
  // Those two kept out now count as used after `lru_used`: they get in next time.
  CHECK(admission.admits(hash_of("gone999"), lru_used, ++clock));
  CHECK(admission.admits(hash_of("gone504"), lru_used, ++clock));
  CHECK(admission.forgotten_early() == 0);  // 1,000 names in 8,192 buckets of eight.
  // Four recurrences (the capacity) made the report due; the farthest was "gone504"'s first:
  // bound - 1 misses since it left, plus the capacity.
  const std::optional<CacheAdmission::Report> report = admission.take_report();
  REQUIRE(report.has_value());
  CHECK(report->recurrences == 4);
  CHECK(report->distance == static_cast<std::int64_t>(bound) + 3);
}

TEST_CASE("Cache admission remembers the latest departures, eight to a bucket, as its model says",
          "[cache][thrash]") {
  // One miss a step, as the cache makes them: the name missed is kept out, or let in (and then,
  // when the cache is full, another leaves for room). Over more names than the memory holds, so
  // that names are forgotten by age and, where nine live ones meet in a bucket (rarely: the next
  // test crowds one on purpose), early (Note [Admission memory]). The model keeps each name's
  // latest departure and its bucket's live names, and applies the rule as the Note words it.
  CacheAdmission admission(4);
  const std::uint64_t bound = CacheAdmission::kMinRemembered;
  struct Latest {
    std::uint64_t used = 0;
    std::uint64_t left = 0;  // The miss it left at.
  };
  std::map<std::uint64_t, Latest> remembered;                   // By hash, live or not.
  std::map<std::size_t, std::vector<std::uint64_t>> bucket_of;  // Its names, by bucket.
  std::uint64_t misses = 0;
  std::int64_t early = 0;
  const auto live = [&](std::uint64_t hash) {
    auto it = remembered.find(hash);
    return it != remembered.end() && misses - it->second.left < bound;
  };
  const auto depart = [&](std::uint64_t hash, std::uint64_t used) {
    std::vector<std::uint64_t>& names = bucket_of[hash & (admission.buckets() - 1)];
    std::erase_if(names, [&](std::uint64_t other) { return other != hash && !live(other); });
    if (std::ranges::find(names, hash) == names.end()) {
      if (names.size() == CacheAdmission::kWays) {  // Full of live names: the first to leave goes.
        auto first = std::ranges::min_element(
            names, {}, [&](std::uint64_t other) { return remembered[other].left; });
        remembered.erase(*first);
        names.erase(first);
        ++early;
      }
      names.push_back(hash);
    }
    remembered[hash] = Latest{.used = used, .left = misses};
  };
  std::mt19937 random(11);
  std::uint64_t clock = 0;
  for (int step = 0; step < 200000; ++step) {
    const std::uint64_t hash = hash_of("n" + std::to_string(random() % 40000));
    const std::uint64_t now = ++clock;
    ++misses;
    // A least recent use somewhere in the recent past, or room.
    std::optional<std::uint64_t> lru_used;
    if (random() % 4 != 0) lru_used = now - 1 - random() % 30000;
    bool expected = true;
    if (live(hash)) {
      if (lru_used && remembered[hash].used < *lru_used) {
        expected = false;
        depart(hash, now);
      } else {
        remembered[hash].left = misses - bound;  // Forgotten: let in.
      }
    }
    REQUIRE(admission.admits(hash, lru_used, now) == expected);
    if (expected && lru_used) {  // Full: the least recently used entry leaves for it.
      const std::uint64_t gone = hash_of("n" + std::to_string(random() % 40000));
      if (gone != hash) {
        admission.evicted_for_room(gone, *lru_used);
        depart(gone, *lru_used);
      }
    }
    if (step % 1000 == 999) {
      const auto alive =
          std::ranges::count_if(remembered, [&](const auto& r) { return live(r.first); });
      REQUIRE(admission.remembered() == static_cast<std::size_t>(alive));
      REQUIRE(admission.forgotten_early() == early);
    }
  }
  CHECK(admission.remembered() > bound / 2);
}

TEST_CASE("A ninth live name in a bucket of cache admission pushes out the first to leave",
          "[cache][thrash]") {
  // Twelve names whose hashes share a bucket (found by trying names), each evicted for room at
  // its own miss: the last eight are remembered, the first four were forgotten early.
  CacheAdmission admission(4);
  std::uint64_t clock = 0;
  const std::uint64_t opened = ++clock;
  CHECK(admission.admits(hash_of("first"), opened, ++clock));
  admission.evicted_for_room(hash_of("opener"), opened);  // Makes the memory.
  const std::size_t mask = admission.buckets() - 1;
  REQUIRE(mask + 1 == 8192);  // kMinRemembered * 4 records / 8 a bucket.
  std::vector<std::string> crowd;
  for (int i = 0; crowd.size() < 12; ++i) {
    const std::string name = "c" + std::to_string(i);
    if ((hash_of(name) & mask) == 5) crowd.push_back(name);
  }
  const std::uint64_t used = ++clock;
  for (const std::string& name : crowd) {
    CHECK(admission.admits(hash_of("new" + name), used, ++clock));
    admission.evicted_for_room(hash_of(name), used);
  }
  CHECK(admission.forgotten_early() == 4);
  CHECK(admission.remembered() == 1 + 8);  // "opener" and the last eight.
  const std::uint64_t lru_used = ++clock;  // Used after every departure.
  for (std::size_t i = 0; i < crowd.size(); ++i) {
    // Forgotten: new, so in. Remembered and older than the least recent use: kept out.
    CHECK(admission.admits(hash_of(crowd[i]), lru_used, ++clock) == (i < 4));
  }
}

TEST_CASE("A name kept out costs no entry: insert_made() builds one only for a name let in",
          "[cache]") {
  // Two entries: "a" kept out is one recurrence of the two that make the report due, so the
  // cache does not settle (Note [Settled cache] in response_cache.h).
  CoordinatorCache cache(2);
  std::vector<std::int32_t> evicted;
  CHECK(cache.insert(entry("a"), &evicted) == 0);
  CHECK(cache.insert(entry("b"), &evicted) == 1);
  CHECK(cache.insert(entry("c"), &evicted) == 2);  // New: let in, evicting "a" (used at 1).
  CHECK(evicted == std::vector<std::int32_t>{0});
  int made = 0;
  const auto insert = [&](const std::string& name) {
    return cache.insert_made(
        {0, name},
        [&] {
          ++made;
          return entry(name);
        },
        &evicted);
  };
  // "a" came back, but it was last used before "b", the least recently used entry: kept out.
  CHECK(insert("a") == -1);
  CHECK(made == 0);
  CHECK(evicted == std::vector<std::int32_t>{0});
  CHECK(cache.size() == 2);
  CHECK_FALSE(cache.settled());
  // A new name gets in: built once, stored under the next id, "b" evicted for it.
  CHECK(insert("d") == 3);
  CHECK(made == 1);
  CHECK(evicted == std::vector<std::int32_t>{0, 1});
  REQUIRE(cache.get(3) != nullptr);
  CHECK(cache.get(3)->name == "d");
  CHECK(cache.id_of({0, "d"}) == 3);
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
