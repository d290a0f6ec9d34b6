// SPDX-License-Identifier: Apache-2.0
// RequestSender::take_new(): each op of a batch goes as its cache id when the rank's cache holds
// an identical request, else in full, in submission order, whatever the batch's length (its
// lookups run as a pipeline of stages 8 ops apart: Note [Lookup pipeline]).
#include "src/core/negotiation/request_sender.h"

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
    std::shared_ptr<Entry> entry = make_entry();
    entry->request = request;
    REQUIRE(queue.push(entry).ok());
    entries.push_back(entry);
  }
  RequestSender sender(queue, cache, std::chrono::microseconds(0));
  const std::optional<RequestList> list = sender.take_new(/*batch_by_yielding=*/false);
  REQUIRE(list.has_value());
  CHECK(list->cache_hits == expected_hits);
  std::vector<std::string> misses;
  for (const Request& request : list->requests) misses.push_back(request.name);
  CHECK(misses == expected_misses);
  int marked = 0;
  for (int i = 0; i < length; ++i) {
    const std::int32_t want = i % 3 == 0 ? 1000 + i : -1;
    marked += entries[static_cast<std::size_t>(i)]->cache_hit == want ? 1 : 0;
  }
  CHECK(marked == length);
  CHECK_FALSE(sender.take_new(false).has_value());  // Nothing new since.
}

}  // namespace
}  // namespace tutti::core
