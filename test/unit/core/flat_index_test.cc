// SPDX-License-Identifier: Apache-2.0
// NameIndex and IdIndex against std::map, the oracle, under random inserts and erases (erasing
// shifts probe runs back, which is where open addressing goes wrong), and with names whose
// hashes collide.
#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/id_index.h"
#include "src/core/name_index.h"

namespace tutti::core {
namespace {

struct Named {
  int set = 0;
  std::string name;
  int value = 0;
};

struct NamedKey {
  OpKeyView operator()(const std::shared_ptr<Named>& named) const {
    return OpKeyView{named->set, named->name};
  }
};

using Index = NameIndex<std::shared_ptr<Named>, NamedKey>;

// Every key of `oracle` is found with its value, and the index holds nothing else.
void check_same(const Index& index, const std::map<std::pair<int, std::string>, int>& oracle) {
  REQUIRE(index.size() == oracle.size());
  for (const auto& [key, value] : oracle) {
    const OpKeyView view{key.first, key.second};
    const std::shared_ptr<Named>* found = index.find(view, name_hash(view));
    REQUIRE(found != nullptr);
    CHECK((*found)->value == value);
  }
  std::size_t visited = 0;
  index.for_each([&](const std::shared_ptr<Named>& named) {
    ++visited;
    CHECK(oracle.count({named->set, named->name}) == 1);
  });
  CHECK(visited == oracle.size());
}

TEST_CASE("NameIndex agrees with std::map under random inserts, takes and take_if", "[index]") {
  std::mt19937 random(7);
  Index index;
  std::map<std::pair<int, std::string>, int> oracle;
  for (int step = 0; step < 20000; ++step) {
    const int set = static_cast<int>(random() % 3);
    const std::string name = "t." + std::to_string(random() % 500);
    const OpKeyView key{set, name};
    const std::uint64_t hash = name_hash(key);
    if (random() % 2 == 0) {
      auto [stored, inserted] = index.insert(hash, std::make_shared<Named>(Named{set, name, step}));
      const bool absent = oracle.count({set, name}) == 0;
      REQUIRE(inserted == absent);
      if (absent) oracle[{set, name}] = step;
      CHECK((*stored)->value == oracle[{set, name}]);
    } else {
      std::shared_ptr<Named> taken = index.take(key, hash);
      auto it = oracle.find({set, name});
      REQUIRE((taken != nullptr) == (it != oracle.end()));
      if (taken != nullptr) {
        CHECK(taken->value == it->second);
        oracle.erase(it);
      }
    }
    if (step % 5000 == 4999) {
      const int doomed = step % 3;
      std::size_t out = 0;
      index.take_if([&](const std::shared_ptr<Named>& named) { return named->set == doomed; },
                    [&](std::shared_ptr<Named>&& named) {
                      CHECK(named->set == doomed);
                      ++out;
                    });
      std::size_t expected = 0;
      for (auto it = oracle.begin(); it != oracle.end();) {
        if (it->first.first == doomed) {
          it = oracle.erase(it);
          ++expected;
        } else {
          ++it;
        }
      }
      CHECK(out == expected);
    }
  }
  check_same(index, oracle);
}

// Note [An index that shrinks]: a burst grows the array; once most of it is taken the array
// shrinks (to the floor here), and the index still agrees with the oracle through both.
TEST_CASE("NameIndex shrinks after a burst and keeps every value", "[index]") {
  std::mt19937 random(11);
  Index index;
  std::map<std::pair<int, std::string>, int> oracle;
  const auto insert = [&](int i) {
    const std::string name = "burst." + std::to_string(i);
    const OpKeyView key{0, name};
    REQUIRE(index.insert(name_hash(key), std::make_shared<Named>(Named{0, name, i})).second);
    oracle[{0, name}] = i;
  };
  for (int i = 0; i < 10000; ++i) insert(i);
  // Half full at most: 10,000 values need 32,768 slots.
  CHECK(index.capacity() == 32768);
  check_same(index, oracle);
  std::vector<int> order(10000);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), random);
  for (std::size_t k = 0; k < 9900; ++k) {
    const std::string name = "burst." + std::to_string(order[k]);
    const OpKeyView key{0, name};
    std::shared_ptr<Named> taken = index.take(key, name_hash(key));
    REQUIRE(taken != nullptr);
    CHECK(taken->value == order[k]);
    oracle.erase({0, name});
    if (k % 1000 == 0) check_same(index, oracle);  // Across the shrinks.
  }
  // 100 left: shrunk at 4,095, 2,047 and 1,023 values, the last time to the floor.
  CHECK(index.capacity() == Index::kShrinkFloor);
  check_same(index, oracle);
  // Growing again from the floor: 3,100 values need 8,192 slots.
  for (int i = 10000; i < 13000; ++i) insert(i);
  CHECK(index.capacity() == 8192);
  check_same(index, oracle);
  // take_if shrinks too.
  index.take_if([](const std::shared_ptr<Named>& named) { return named->value >= 10000; },
                [](std::shared_ptr<Named>&&) {});
  for (auto it = oracle.begin(); it != oracle.end();) {
    it = it->second >= 10000 ? oracle.erase(it) : std::next(it);
  }
  CHECK(index.capacity() == Index::kShrinkFloor);
  check_same(index, oracle);
}

// Every name is filed under the same hash: lookups must still tell them apart by name.
TEST_CASE("NameIndex tells names apart whose hashes are equal", "[index]") {
  Index index;
  constexpr std::uint64_t kSame = 12345;
  for (int i = 0; i < 40; ++i)
    REQUIRE(
        index.insert(kSame, std::make_shared<Named>(Named{0, "n" + std::to_string(i), i})).second);
  CHECK_FALSE(index.insert(kSame, std::make_shared<Named>(Named{0, "n7", 99})).second);
  CHECK(index.find(OpKeyView{0, "n7"}, kSame)->get()->value == 7);
  CHECK(index.find(OpKeyView{1, "n7"}, kSame) == nullptr);
  CHECK(index.find(OpKeyView{0, "n7"}, kSame + 1) == nullptr);
  for (int i = 0; i < 40; i += 2) REQUIRE(index.take(OpKeyView{0, "n" + std::to_string(i)}, kSame));
  for (int i = 0; i < 40; ++i) {
    const std::shared_ptr<Named>* found = index.find(OpKeyView{0, "n" + std::to_string(i)}, kSame);
    CHECK((found != nullptr) == (i % 2 == 1));
  }
  CHECK(index.size() == 20);
}

TEST_CASE("NameIndex::peek gives the first value of a hash's probe run, comparing no keys",
          "[index]") {
  Index index;
  CHECK(index.peek(42) == nullptr);  // Empty: no slots to probe.
  const OpKeyView a{0, "a"};
  const OpKeyView b{0, "b"};
  REQUIRE(index.insert(name_hash(a), std::make_shared<Named>(Named{0, "a", 1})).second);
  REQUIRE(index.insert(name_hash(b), std::make_shared<Named>(Named{0, "b", 2})).second);
  REQUIRE(index.peek(name_hash(a)) != nullptr);
  CHECK((*index.peek(name_hash(a)))->value == 1);
  CHECK((*index.peek(name_hash(b)))->value == 2);
  CHECK(index.peek(name_hash(OpKeyView{0, "c"})) == nullptr);
  // Names of one hash: peek() gives the first of its run, which find() may not. After take()
  // shifts the run back, it gives the next.
  constexpr std::uint64_t kSame = 777;
  for (int i = 0; i < 3; ++i)
    REQUIRE(
        index.insert(kSame, std::make_shared<Named>(Named{1, "s" + std::to_string(i), i})).second);
  REQUIRE(index.peek(kSame) != nullptr);
  CHECK((*index.peek(kSame))->name == "s0");
  REQUIRE(index.take(OpKeyView{1, "s0"}, kSame));
  REQUIRE(index.peek(kSame) != nullptr);
  CHECK((*index.peek(kSame))->name == "s1");
  REQUIRE(index.take(OpKeyView{1, "s1"}, kSame));
  REQUIRE(index.take(OpKeyView{1, "s2"}, kSame));
  CHECK(index.peek(kSame) == nullptr);
}

TEST_CASE("IdIndex agrees with std::map under random inserts and erases", "[index]") {
  std::mt19937 random(11);
  IdIndex<int> index;
  std::map<std::int32_t, int> oracle;
  for (int step = 0; step < 50000; ++step) {
    // A sliding window of ids, as the coordinator hands them out, plus a few long-lived ones.
    const std::int32_t id = random() % 8 == 0
                                ? static_cast<std::int32_t>(random() % 16)
                                : step / 4 + static_cast<std::int32_t>(random() % 300);
    if (random() % 3 != 0) {
      index[id] = step;
      oracle[id] = step;
    } else {
      CHECK(index.erase(id) == (oracle.erase(id) == 1));
    }
  }
  REQUIRE(index.size() == oracle.size());
  for (const auto& [id, value] : oracle) {
    REQUIRE(index.find(id) != nullptr);
    CHECK(*index.find(id) == value);
  }
  std::size_t visited = 0;
  index.for_each([&](std::int32_t id, int value) {
    ++visited;
    CHECK(oracle.at(id) == value);
  });
  CHECK(visited == oracle.size());
  CHECK_FALSE(index.contains(1000000));
}

TEST_CASE("IdIndex keeps a sliding window of consecutive ids, as a churning cache has", "[index]") {
  // The window is one long run of slots (Note [Id index]); every erase must keep the rest
  // findable, and ids that wrap around the table must not shadow each other.
  IdIndex<std::int32_t> index;
  constexpr std::int32_t kWindow = 1000;
  for (std::int32_t id = 0; id < 20000; ++id) {
    index[id] = id * 3;
    if (id >= kWindow) REQUIRE(index.erase(id - kWindow));
    if (id % 997 == 0) {
      for (std::int32_t live = std::max(0, id - kWindow + 1); live <= id; ++live) {
        REQUIRE(index.find(live) != nullptr);
        REQUIRE(*index.find(live) == live * 3);
      }
      CHECK(index.find(id - kWindow) == nullptr);
      CHECK(index.find(id + 1) == nullptr);
    }
  }
  CHECK(index.size() == static_cast<std::size_t>(kWindow));
}

}  // namespace
}  // namespace tutti::core
