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

// Runs `count` collectives on `choice` at the given costs and returns the positions of those
// that used the kind not in use at the end: its tries (Note [How often the other kind is tried]).
std::vector<int> tries(StagingChoice& choice, int count, double cached, double streaming) {
  std::vector<bool> streamed;
  for (int i = 0; i < count; ++i) streamed.push_back(run(choice, 1, cached, streaming) == 1);
  const bool in_use = streamed.back();
  std::vector<int> at;
  for (int i = 0; i < count; ++i) {
    if (streamed[static_cast<std::size_t>(i)] != in_use) at.push_back(i);
  }
  return at;
}

TEST_CASE("Auto uses the cheaper kind and tries the other as its gap allows", "[staging]") {
  // The first two collectives (the warm-up and the first measured) use ordinary stores and the
  // third streams: it counts as a try. From there the wait for the next try starts at 32
  // collectives and doubles with each try, up to 128, or up to what keeps a try's extra cost
  // within 1/400 of the collectives since the last: ceil((c / u - 1) * 400) collectives for the
  // other kind's cost c and the kind in use's u, at least 32.
  SECTION("Streaming stores cost 1.5 times as much: the budget allows 200, the longest is 128") {
    StagingChoice choice;
    CHECK(tries(choice, 1000, 1.0, 1.5) ==
          std::vector<int>{2, 34, 98, 226, 354, 482, 610, 738, 866, 994});
  }
  SECTION("Three times as much: the same") {
    StagingChoice choice;
    CHECK(tries(choice, 600, 1.0, 3.0) == std::vector<int>{2, 34, 98, 226, 354, 482});
  }
  SECTION("1.25 times as much: the budget's 100") {
    StagingChoice choice;
    CHECK(tries(choice, 400, 1.0, 1.25) == std::vector<int>{2, 34, 98, 198, 298, 398});
  }
  SECTION("Within 8 %: every 32nd, the shortest wait") {
    StagingChoice choice;
    CHECK(tries(choice, 100, 1.0, 1.0625) == std::vector<int>{2, 34, 66, 98});
  }
  SECTION("Ordinary stores cost three times as much: streaming ones in use, tried likewise") {
    // Collective 3 still uses ordinary stores (streaming ones' cost, collective 2's, is learned
    // at 4); collective 4 switches, and the wait starts again from there at 32: ordinary stores
    // at 0, 1, 3, then 36, 100, 228 and 356.
    StagingChoice choice;
    std::vector<int> ordinary;
    for (int i = 0; i < 400; ++i) {
      if (run(choice, 1, 3.0, 1.0) == 0) ordinary.push_back(i);
    }
    CHECK(ordinary == std::vector<int>{0, 1, 3, 36, 100, 228, 356});
  }
}

TEST_CASE("Auto switches when the kind in use gets costlier, and back after a try", "[staging]") {
  StagingChoice choice;
  // Ordinary stores in use; streaming ones tried at 2, 34, 98 and 226, the wait now 128.
  run(choice, 300, 1.0, 1.5);
  // The placement changes: ordinary stores now cost 2.5 ns a byte. Collective n learns n - 2's
  // cost, and their average moves a quarter of the way each time: 1.375 at collective 302, 1.656
  // at 303. At 302 the gap to streaming's 1.5 has narrowed to 1.5 / 1.375 - 1 = 0.09, a budget
  // of 37 collectives, and 76 have passed since the last try: 302 tries streaming stores.
  CHECK(run(choice, 2, 2.5, 1.5) == 0);
  CHECK(run(choice, 1, 2.5, 1.5) == 1);
  // 305 learns 303's cost (1.867), 306 learns 304's (2.025): 1.5 is less than 0.8 times that,
  // so 306 switches to streaming stores, and the wait starts again at 32.
  CHECK(run(choice, 3, 2.5, 1.5) == 0);
  CHECK(run(choice, 1, 2.5, 1.5) == 1);
  // Ordinary stores are tried at 338, 402 and 530 (waits of 32, 64 and 128).
  CHECK(run(choice, 31, 2.5, 1.5) == 31);
  CHECK(run(choice, 1, 2.5, 1.5) == 0);
  CHECK(run(choice, 63, 2.5, 1.5) == 63);
  CHECK(run(choice, 1, 2.5, 1.5) == 0);
  CHECK(run(choice, 127, 2.5, 1.5) == 127);
  CHECK(run(choice, 1, 2.5, 1.5) == 0);
  // From 531 on ordinary stores cost 1.0 again, below 0.8 times 1.5; the try at 658 measures
  // that, and 660, which learns it, switches back. Streaming stores are next tried at 692.
  CHECK(run(choice, 127, 1.0, 1.5) == 127);
  CHECK(run(choice, 1, 1.0, 1.5) == 0);
  CHECK(run(choice, 1, 1.0, 1.5) == 1);
  CHECK(run(choice, 32, 1.0, 1.5) == 0);
  CHECK(run(choice, 1, 1.0, 1.5) == 1);
}

TEST_CASE("Auto does not record the first measured collective", "[staging]") {
  StagingChoice choice;
  // The first collective pays first-use costs: ten times what ordinary stores cost after.
  // Recorded, it would make streaming (1.5) look cheaper than ordinary stores (1.0), and the
  // choice would stream from collective 4 on.
  CHECK(run(choice, 1, 10.0, 1.5) == 0);
  // Not recorded: the next measures ordinary stores again, the one after streaming, and then
  // only the tries stream (collectives 1 .. 199 here: 2, 34 and 98).
  CHECK(run(choice, 199, 1.0, 1.5) == 3);
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
  constexpr int kCollectives = 600;
  bool alike = true;
  for (int i = 0; i < kCollectives; ++i) {
    const bool w = writer.streaming(kBytes);
    const bool r = reader.streaming(kBytes);
    alike = alike && w == r;
    writer.record(kBytes, nanoseconds(static_cast<std::int64_t>((w ? 1.5 : 1.0) * kBytes)));
    reader.record(kBytes, nanoseconds(static_cast<std::int64_t>((r ? 1.0 : 3.0) * kBytes)));
  }
  CHECK(alike);
  // Both streamed the writer's tries: collectives 2, 34, 98, 226, 354 and 482.
  CHECK(writer.streamed() == 6);
  CHECK(reader.streamed() == 6);
}

TEST_CASE("A rank that finds no cost on the board uses its own", "[staging]") {
  // The writer has not got there yet: every word is older than what the reader looks for.
  std::uint64_t board[StagingChoice::kBoardWords] = {};
  StagingChoice reader;
  reader.share(board, false);
  // Streaming stores cost a third: they are in use from collective 4 on (when collective 2's
  // cost is learned), and ordinary stores, three times as dear, are tried after waits of 32, 64
  // and then 128 collectives from there. Collectives 0, 1, 3, 36, 100, 228, 356, 484, 612, 740,
  // 868 and 996 use ordinary stores.
  CHECK(run(reader, 1000, 3.0, 1.0) == 988);
}

}  // namespace
}  // namespace tutti::ops::shm
