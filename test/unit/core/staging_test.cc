// SPDX-License-Identifier: Apache-2.0
// How a shared-memory rank stages its chunks (Note [Streaming stores] in ops/shm/staging.h):
// stream_copy() against the bytes it was given, and StagingChoice against closed-form costs per
// byte. The backend under each choice is tested in test/mpi/collectives/shm_stores_test.cc.
#include "ops/shm/staging.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::ops::shm {
namespace {

using std::chrono::nanoseconds;

TEST_CASE("stream_copy copies every byte at any alignment and touches no other", "[staging]") {
  constexpr std::size_t kRoom = 400;
  for (std::size_t to_offset = 0; to_offset < 20; ++to_offset) {
    for (std::size_t from_offset = 0; from_offset < 20; from_offset += 3) {
      for (std::size_t bytes : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 200, 333}) {
        std::vector<unsigned char> from(kRoom);
        for (std::size_t i = 0; i < kRoom; ++i) from[i] = static_cast<unsigned char>(i * 7 + 1);
        std::vector<unsigned char> to(kRoom + 32, 0xAB);
        stream_copy(to.data() + to_offset, from.data() + from_offset, bytes);
        bool ok = true;
        for (std::size_t i = 0; i < to.size(); ++i) {
          const bool inside = i >= to_offset && i < to_offset + bytes;
          const unsigned char want =
              inside ? static_cast<unsigned char>((i - to_offset + from_offset) * 7 + 1) : 0xAB;
          ok = ok && to[i] == want;
        }
        INFO("to_offset " << to_offset << " from_offset " << from_offset << " bytes " << bytes);
        CHECK(ok);
      }
    }
  }
}

constexpr std::size_t kBytes = StagingChoice::kMeasuredBytes;

// Runs `count` collectives of kBytes on `choice`, each taking `cached` or `streaming` ns per
// byte as staged; returns how many streamed.
int run(StagingChoice& choice, int count, double cached, double streaming) {
  int streamed = 0;
  for (int i = 0; i < count; ++i) {
    const bool s = choice.streaming(kBytes);
    streamed += s ? 1 : 0;
    const double per_byte = s ? streaming : cached;
    choice.record(kBytes, nanoseconds(static_cast<std::int64_t>(per_byte * kBytes)));
  }
  return streamed;
}

TEST_CASE("A fixed choice is kept whatever the costs", "[staging]") {
  StagingChoice cached(ShmStores::Cached);
  CHECK(run(cached, 100, 5.0, 1.0) == 0);
  CHECK(cached.streamed() == 0);
  StagingChoice streaming(ShmStores::Streaming);
  CHECK(run(streaming, 100, 1.0, 5.0) == 100);
  CHECK(streaming.streamed() == 100);
  // Streaming means every staged chunk, small ones too.
  CHECK(streaming.streaming(64));
}

TEST_CASE("Auto stages small collectives with ordinary stores and measures none", "[staging]") {
  StagingChoice choice;
  for (int i = 0; i < 100; ++i) {
    CHECK_FALSE(choice.streaming(kBytes - 1));
    // Costs of small collectives are not measured: streaming would look 100x cheaper.
    choice.record(kBytes - 1, nanoseconds(100 * kBytes));
  }
  // The first measured collective is still the first of its kind.
  CHECK_FALSE(choice.streaming(kBytes));
  CHECK(choice.streamed() == 0);
}

TEST_CASE("Auto uses the cheaper kind and tries the other every period", "[staging]") {
  const int period = static_cast<int>(StagingChoice::kExplorePeriod);
  StagingChoice choice;
  // Ordinary stores cost 1 ns a byte, streaming 1.5: the first two collectives (the warm-up and
  // the first measured) are staged with ordinary stores, the third streams, and then every
  // period-th (by count) streams.
  const int collectives = 10 * period;
  CHECK(run(choice, collectives, 1.0, 1.5) == 1 + (collectives - 1) / period);
  // The placement changes (ordinary stores now cost 2.5 ns a byte). Within a period it
  // switches: the first ordinary collectives at the new cost move the average past
  // streaming's 1.5. From then on only every period-th collective uses ordinary stores.
  run(choice, period, 2.5, 1.5);
  CHECK(run(choice, 4 * period, 2.5, 1.5) == 4 * period - 4);
  // And back, once the ordinary stores are measured cheaper again.
  run(choice, period, 1.0, 1.5);
  CHECK(run(choice, 4 * period, 1.0, 1.5) == 4);
}

TEST_CASE("Auto tries a kind measured twice as costly four times as rarely", "[staging]") {
  const int far = static_cast<int>(StagingChoice::kFarExplorePeriod);
  StagingChoice choice;
  run(choice, 3, 1.0, 3.0);  // The warm-up, then one of each: streaming cost three times as much.
  // Collectives 3 .. 3 + 4 far - 1: the tries are at multiples of the long period.
  CHECK(run(choice, 4 * far, 1.0, 3.0) == 4);
}

TEST_CASE("Auto does not record the first measured collective", "[staging]") {
  const int period = static_cast<int>(StagingChoice::kExplorePeriod);
  StagingChoice choice;
  // The first collective pays first-use costs: ten times what ordinary stores cost after.
  // Recorded, it would make streaming (1.5) look cheaper than ordinary stores (1.0), and more
  // than twice as cheap, so that ordinary stores would be tried again only every long period.
  CHECK(run(choice, 1, 10.0, 1.5) == 0);
  // Not recorded: the next measures ordinary stores again, the one after streaming, and from
  // then on only every period-th collective streams (collectives 1 .. 4 period - 1 here).
  CHECK(run(choice, 4 * period - 1, 1.0, 1.5) == 1 + 3);
}

TEST_CASE("Auto does not switch on one disturbed collective", "[staging]") {
  StagingChoice choice;
  run(choice, 3, 1.0, 1.5);  // The warm-up, then one of each: ordinary stores are cheaper.
  // One ordinary collective takes 2.5 ns a byte (the rank was descheduled): the average of the
  // kind in use moves a quarter of the way, to 1.375, still below streaming's 1.5.
  for (int i = 0; i < 3; ++i) {
    const bool s = choice.streaming(kBytes);
    REQUIRE_FALSE(s);
    choice.record(kBytes, nanoseconds(static_cast<std::int64_t>((i == 0 ? 2.5 : 1.0) * kBytes)));
  }
  CHECK(run(choice, 20, 1.0, 1.5) == 0);
}

TEST_CASE("Auto decides each collective from the costs of the collectives two before",
          "[staging]") {
  StagingChoice choice;
  run(choice, 5, 1.0, 1.5);  // Collectives 0-4: ordinary stores are cheaper and in use.
  // From collective 5 on, ordinary stores cost 3 ns a byte. Collective n learns n - 2's cost:
  // collective 7 learns 5's (the average of ordinary stores goes to 1.5), 8 learns 6's (1.875)
  // and 9 learns 7's (2.156): 1.5 is less than 0.8 times that, so collective 9 streams.
  CHECK(run(choice, 4, 3.0, 1.5) == 0);
  CHECK(run(choice, 1, 3.0, 1.5) == 1);
}

TEST_CASE("Ranks that share a board choose alike, from the writer's costs", "[staging]") {
  std::uint64_t board[StagingChoice::kBoardWords] = {};
  StagingChoice writer;
  StagingChoice reader;
  writer.share(board, true);
  reader.share(board, false);
  // Host rank 0 finds ordinary stores cheaper; another rank, which waited for its peers in the
  // collectives that used them, finds them three times as dear as streaming ones.
  constexpr int kCollectives = 200;
  bool alike = true;
  for (int i = 0; i < kCollectives; ++i) {
    const bool w = writer.streaming(kBytes);
    const bool r = reader.streaming(kBytes);
    alike = alike && w == r;
    writer.record(kBytes, nanoseconds(static_cast<std::int64_t>((w ? 1.5 : 1.0) * kBytes)));
    reader.record(kBytes, nanoseconds(static_cast<std::int64_t>((r ? 1.0 : 3.0) * kBytes)));
  }
  CHECK(alike);
  // Both streamed collective 2 and the tries, every period-th.
  const auto tries =
      static_cast<std::uint64_t>(1 + (kCollectives - 1) / StagingChoice::kExplorePeriod);
  CHECK(writer.streamed() == tries);
  CHECK(reader.streamed() == tries);
}

TEST_CASE("A rank that finds no cost on the board uses its own", "[staging]") {
  // The writer has not got there yet: every word is older than what the reader looks for.
  std::uint64_t board[StagingChoice::kBoardWords] = {};
  StagingChoice reader;
  reader.share(board, false);
  // Streaming stores cost a third: they are in use from collective 4 on (when collective 2's
  // cost is learned), and ordinary stores, three times as dear, are tried at multiples of the
  // long period only. Collectives 0, 1, 3 and 128 use ordinary stores.
  CHECK(run(reader, 200, 3.0, 1.0) == 196);
}

}  // namespace
}  // namespace tutti::ops::shm
