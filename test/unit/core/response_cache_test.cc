// SPDX-License-Identifier: Apache-2.0
#include "src/core/response_cache.h"

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
  // One change to each field of Request (the list mirrors its declaration); a rank sends the
  // cache id only for an identical request.
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
  CHECK(cache.lookup(base) == std::optional<std::int32_t>(7));
  CHECK(equal_but_key(base, base));
  for (std::size_t i = 0; i < changes.size(); ++i) {
    Request changed = base;
    changes[i](changed);
    INFO("change " << i);
    CHECK_FALSE(changed == base);
    CHECK_FALSE(equal_but_key(changed, base));
    CHECK_FALSE(cache.lookup(changed).has_value());
  }
  // The key is the index's to compare: another name or set is another entry.
  Request renamed = base;
  renamed.name = "v";
  renamed.process_set_id = 2;
  CHECK(equal_but_key(renamed, base));
  CHECK_FALSE(cache.lookup(renamed).has_value());
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
