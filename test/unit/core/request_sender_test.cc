// SPDX-License-Identifier: Apache-2.0
// RequestSender::take_new(): each op of a batch goes as its cache id when the rank's cache holds
// an identical request, else in full, in submission order, whatever the batch's length (its
// lookups run as a pipeline of stages 8 ops apart: Note [Lookup pipeline]). take_resend(): the
// hits the coordinator asks back go again in full, in the order asked, once each.
#include "src/core/negotiation/request_sender.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

Request allreduce_of(const std::string& name, std::int64_t count) {
  Request request;
  request.name = name;
  request.op = Collective::Allreduce;
  request.tensors = {TensorSpec{.dtype = DataType::Float32, .shape = {count}}};
  return request;
}

// A new op submitted with `request`, accepted by `queue`.
std::shared_ptr<Entry> pushed(TensorQueue& queue, const Request& request) {
  std::shared_ptr<Entry> entry = make_entry();
  entry->request = request;
  REQUIRE(queue.push(entry).ok());
  return entry;
}

TEST_CASE("take_new sends cached ops as their ids and the rest in full, in order", "[sender]") {
  const int length = GENERATE(1, 2, 8, 9, 23, 24, 25, 26, 100);
  TensorQueue queue;
  RankCache cache;
  // Op i: cached as id 1000 + i when i % 3 == 0; cached with another shape when i % 3 == 1
  // (a miss: the request differs); never cached when i % 3 == 2.
  std::vector<std::int32_t> expected_hits;
  std::vector<std::string> expected_misses;
  std::vector<std::shared_ptr<Entry>> entries;
  for (int i = 0; i < length; ++i) {
    const std::string name = "op" + std::to_string(i);
    const Request request = allreduce_of(name, 4);
    if (i % 3 == 0) cache.insert(1000 + i, request, Response());
    if (i % 3 == 1) cache.insert(1000 + i, allreduce_of(name, 5), Response());
    if (i % 3 == 0) {
      expected_hits.push_back(1000 + i);
    } else {
      expected_misses.push_back(name);
    }
    entries.push_back(pushed(queue, request));
  }
  RequestSender sender(queue, cache, std::chrono::microseconds(0));
  const std::optional<RequestList> list = sender.take_new(/*batch_by_yielding=*/false);
  REQUIRE(list.has_value());
  CHECK(list->cache_hits == expected_hits);
  std::vector<std::string> misses;
  for (const Request& request : list->requests) misses.push_back(request.name.str());
  CHECK(misses == expected_misses);
  int marked = 0;
  for (int i = 0; i < length; ++i) {
    const std::int32_t want = i % 3 == 0 ? 1000 + i : -1;
    marked += entries[static_cast<std::size_t>(i)]->cache_hit == want ? 1 : 0;
  }
  CHECK(marked == length);
  CHECK_FALSE(sender.take_new(false).has_value());  // Nothing new since.
}

TEST_CASE("take_resend sends the asked hits in full, in the order asked, and only those",
          "[sender]") {
  const int length = GENERATE(1, 7, 300);
  TensorQueue queue;
  RankCache cache;
  std::vector<std::shared_ptr<Entry>> entries;
  for (int i = 0; i < length; ++i) {
    const Request request = allreduce_of("op" + std::to_string(i), 4);
    cache.insert(5000 + i, request, Response());
    entries.push_back(pushed(queue, request));
  }
  RequestSender sender(queue, cache, std::chrono::microseconds(0));
  const std::optional<RequestList> sent = sender.take_new(/*batch_by_yielding=*/false);
  REQUIRE(sent.has_value());
  REQUIRE(sent->cache_hits.size() == static_cast<std::size_t>(length));
  // Every other op asked back, in a shuffled order, plus an id no op in flight was sent as.
  std::vector<std::int32_t> asked;
  for (int i = 0; i < length; i += 2) asked.push_back(5000 + i);
  std::shuffle(asked.begin(), asked.end(), std::mt19937(static_cast<unsigned>(length)));
  const std::vector<std::int32_t> once = asked;
  asked.push_back(4999);
  asked.push_back(asked.front());  // Asked twice: sent once, at its first place.
  const std::optional<RequestList> again = sender.take_resend(asked);
  REQUIRE(again.has_value());
  CHECK(again->cache_hits.empty());
  std::vector<std::string> names;
  for (const Request& request : again->requests) names.push_back(request.name.str());
  std::vector<std::string> expected;
  for (std::int32_t id : once) expected.push_back("op" + std::to_string(id - 5000));
  CHECK(names == expected);
  // The resent ops are no longer hits, so asking again sends nothing; the others still are.
  for (int i = 0; i < length; ++i) {
    CHECK(entries[static_cast<std::size_t>(i)]->cache_hit == (i % 2 == 0 ? -1 : 5000 + i));
  }
  const std::optional<RequestList> twice = sender.take_resend(asked);
  REQUIRE(twice.has_value());
  CHECK(twice->requests.empty());
}

}  // namespace
}  // namespace tutti::core
