// SPDX-License-Identifier: Apache-2.0
// The RPC agent with threads as workers (fake transport): calls to self and others, every error,
// nested calls, many concurrent calls, big messages in pieces, and both shutdowns.
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/support/error_of.h"
#include "test/unit/rpc/rpc_harness.h"

namespace tutti::test {
namespace {

using rpc::Message;

// A rank's outcome: empty when fine, else what went wrong.
using Outcome = std::vector<std::string>;

void expect(Outcome& out, bool ok, const std::string& what) {
  if (!ok) out.push_back(what);
}

TEST_CASE("rpc_sync, rpc_async and remote reach every worker, this one included", "[rpc]") {
  const int size = GENERATE(1, 2, 3);
  std::vector<Outcome> outcome(static_cast<std::size_t>(size));
  Group group(size);
  group.run([&](int rank) {
    Outcome& out = outcome[static_cast<std::size_t>(rank)];
    for (int to = 0; to < size; ++to) {
      const std::string dest = worker(to);
      nn::Variable a(filled({2, 3}, float(rank)), false),
          b(filled({2, 3}, 10.0f * float(to)), false);
      Message sum = rpc::rpc_sync(dest, "add", {.tensors = {a, b}, .rrefs = {}, .bytes = {}});
      expect(out,
             sum.tensors.size() == 1 &&
                 values_of(sum.tensors[0].value()) == values_of((a + b).value()),
             "add to " + dest);
      rpc::Future f =
          rpc::rpc_async(dest, "echo", {.tensors = {a}, .rrefs = {}, .bytes = "hi " + dest});
      Message echoed = f.wait();
      expect(out, f.done() && echoed.bytes == "hi " + dest, "echo bytes from " + dest);
      // Values are copied, also to this worker itself.
      echoed.tensors.at(0).value().span<float>()[0] = -1.0f;
      expect(out, a.value().span<float>()[0] == float(rank), "echo copied the tensor");
      rpc::RRef ref = rpc::remote(dest, "echo", {.tensors = {b}, .rrefs = {}, .bytes = "kept"});
      expect(out,
             ref.owner().name == dest && ref.owner().id == to && ref.is_owner() == (to == rank),
             "RRef owner of " + dest);
      Message here = ref.to_here();
      expect(out,
             here.bytes == "kept" && values_of(here.tensors.at(0).value()) == values_of(b.value()),
             "to_here from " + dest);
      expect(out, ref.confirmed_by_owner(), "confirmed after to_here");
      expect(out, rpc::get_worker_info(dest).id == to, "get_worker_info");
    }
    expect(out,
           rpc::get_worker_info().name == worker(rank) &&
               rpc::get_worker_infos().size() == std::size_t(size),
           "worker infos");
  });
  for (const Outcome& out : outcome) CHECK(out == Outcome{});
}

TEST_CASE("Unknown workers and functions, remote exceptions and timeouts fail the call", "[rpc]") {
  std::vector<Outcome> outcome(2);
  std::vector<std::optional<ErrorCode>> codes(20);
  std::vector<std::string> messages(20);
  Group group(2);
  group.run([&](int rank) {
    if (rank != 0) return;
    int i = 0;
    auto record = [&](auto&& f) {
      codes[static_cast<std::size_t>(i)] = error_of(f, &messages[static_cast<std::size_t>(i)]);
      ++i;
    };
    record([] { rpc::rpc_async("nobody", "echo"); });  // 0
    record([] { rpc::rpc_sync("w1", "nope"); });       // 1
    record([] {
      rpc::rpc_sync("w1", "raise", {.tensors = {}, .rrefs = {}, .bytes = "1"});
    });  // 2 Mismatch
    record(
        [] { rpc::rpc_sync("w1", "raise", {.tensors = {}, .rrefs = {}, .bytes = "std"}); });  // 3
    record([] {
      rpc::rpc_sync("w1", "sleep", {.tensors = {}, .rrefs = {}, .bytes = "500"}, 0.05);
    });  // 4
    record([] {
      rpc::remote("w1", "raise", {.tensors = {}, .rrefs = {}, .bytes = "1"}).to_here();
    });  // 5
    record([] {
      rpc::remote("w1", "sleep", {.tensors = {}, .rrefs = {}, .bytes = "500"}, 0.05).to_here();
    });                                                        // 6
    record([] { rpc::rpc_sync("w1", "echo", {}, -1.0); });     // 7
    record([] { rpc::rpc_sync("w1", "tutti.rref.delete"); });  // 8
    record([] {
      rpc::rpc_sync("w1", "echo", {.tensors = {}, .rrefs = {rpc::RRef()}, .bytes = {}});
    });                                                       // 9
    record([] { rpc::remote("w1", "echo").local_value(); });  // 10
    record([] {
      rpc::rpc_sync("w0", "raise", {.tensors = {}, .rrefs = {}, .bytes = "std"});
    });                                    // 11 self
    record([] { rpc::Future().wait(); });  // 12
  });
  CHECK(codes[0] == ErrorCode::InvalidArgument);
  CHECK_THAT(messages[0], Catch::Contains("nobody"));
  CHECK(codes[1] == ErrorCode::InvalidArgument);
  CHECK_THAT(messages[1], Catch::Contains("'nope'") && Catch::Contains("w1"));
  CHECK(codes[2] == ErrorCode::Mismatch);
  CHECK_THAT(messages[2],
             Catch::Contains("w1") && Catch::Contains("coded boom") && Catch::Contains("'raise'"));
  CHECK(codes[3] == ErrorCode::Internal);
  CHECK_THAT(messages[3], Catch::Contains("w1") && Catch::Contains("plain boom"));
  CHECK(codes[4] == ErrorCode::Timeout);
  CHECK_THAT(messages[4], Catch::Contains("'sleep'") && Catch::Contains("w1"));
  CHECK(codes[5] == ErrorCode::Mismatch);
  CHECK_THAT(messages[5], Catch::Contains("coded boom"));
  CHECK(codes[6] == ErrorCode::Timeout);
  for (int i : {7, 8, 9, 10, 12})
    CHECK(codes[static_cast<std::size_t>(i)] == ErrorCode::InvalidArgument);
  CHECK(codes[11] == ErrorCode::Internal);
  CHECK_THAT(messages[11], Catch::Contains("w0") && Catch::Contains("plain boom"));
}

TEST_CASE("Calls after shutdown fail with ShutDown", "[rpc]") {
  std::vector<std::optional<ErrorCode>> codes(2);
  Group group(2);
  group.run([](int) {});
  for (int rank = 0; rank < 2; ++rank) {
    rpc::detail::AgentScope scope(&group.agent(rank));
    codes[static_cast<std::size_t>(rank)] = error_of([] { rpc::rpc_sync("w1", "echo"); });
  }
  CHECK(codes[0] == ErrorCode::ShutDown);
  CHECK(codes[1] == ErrorCode::ShutDown);
}

TEST_CASE("Nested calls through three workers and back never deadlock, one pool thread each",
          "[rpc]") {
  std::vector<std::string> result(3);
  Group group(3, GroupOptions{.rpc = {.timeout_seconds = 20, .num_worker_threads = 1}});
  group.run([&](int rank) {
    // Every worker starts a chain at once; each goes round twice, back through its caller.
    std::string path;
    for (int hop = 1; hop <= 6; ++hop) path += (path.empty() ? "" : ",") + worker((rank + hop) % 3);
    result[static_cast<std::size_t>(rank)] =
        rpc::rpc_sync(worker((rank + 1) % 3), "chain", {.tensors = {}, .rrefs = {}, .bytes = path})
            .bytes;
  });
  for (int rank = 0; rank < 3; ++rank) {
    std::string expected = worker((rank + 1) % 3);
    for (int hop = 1; hop <= 6; ++hop) expected += ">" + worker((rank + hop) % 3);
    CHECK(result[static_cast<std::size_t>(rank)] == expected);
  }
}

TEST_CASE("1,000 concurrent rpc_async calls all complete with their own results", "[rpc]") {
  const int size = GENERATE(2, 3);
  std::vector<int> right(static_cast<std::size_t>(size), 0);
  Group group(size);
  group.run([&](int rank) {
    std::vector<rpc::Future> futures;
    for (int i = 0; i < 1000; ++i) {
      nn::Variable t(filled({3}, float(i)), false);
      futures.push_back(rpc::rpc_async(worker((rank + 1) % size), "echo",
                                       {.tensors = {t}, .rrefs = {}, .bytes = std::to_string(i)}));
    }
    for (int i = 0; i < 1000; ++i) {
      Message m = futures[static_cast<std::size_t>(i)].wait();
      right[static_cast<std::size_t>(rank)] +=
          m.bytes == std::to_string(i) &&
          values_of(m.tensors.at(0).value()) == values_of(filled({3}, float(i)));
    }
  });
  for (int r : right) CHECK(r == 1000);
}

TEST_CASE("Big messages cross the plane in pieces", "[rpc]") {
  std::vector<Outcome> outcome(2);
  Group group(2, GroupOptions{.rpc = {}, .graceful = true, .max_piece_bytes = 1000});
  group.run([&](int rank) {
    Outcome& out = outcome[static_cast<std::size_t>(rank)];
    nn::Variable big(filled({512, 512}, float(rank), 0.25f), false);  // 1 MiB.
    Message m = rpc::rpc_sync(worker(1 - rank), "echo",
                              {.tensors = {big}, .rrefs = {}, .bytes = std::string(5000, 'x')});
    expect(out,
           values_of(m.tensors.at(0).value()) == values_of(big.value()) &&
               m.bytes == std::string(5000, 'x'),
           "1 MiB echo");
  });
  for (const Outcome& out : outcome) CHECK(out == Outcome{});
}

TEST_CASE("Graceful shutdown waits for the calls in flight everywhere", "[rpc][shutdown]") {
  constexpr int kSize = 3;
  std::vector<std::vector<rpc::Future>> futures(kSize);
  Group group(kSize);
  group.run([&](int rank) {
    // No waiting: the harness shuts down right after these calls are made.
    for (int i = 0; i < 20; ++i) {
      futures[static_cast<std::size_t>(rank)].push_back(rpc::rpc_async(
          worker((rank + 1) % kSize), "sleep", {.tensors = {}, .rrefs = {}, .bytes = "10"}));
      futures[static_cast<std::size_t>(rank)].push_back(
          rpc::rpc_async(worker((rank + 2) % kSize), "chain",
                         {.tensors = {}, .rrefs = {}, .bytes = worker(rank)}));
    }
  });
  for (auto& per_rank : futures) {
    for (rpc::Future& f : per_rank) {
      REQUIRE(f.done());
      CHECK_FALSE(error_of([&] { f.wait(); }).has_value());
    }
  }
}

TEST_CASE("A worker that leaves fails the calls waiting on it with ShutDown", "[rpc][shutdown]") {
  std::optional<ErrorCode> pending, later;
  std::string message;
  std::atomic<bool> called{false};
  Group group(2, GroupOptions{.rpc = {}, .graceful = false});
  group.run([&](int rank) {
    if (rank == 1) {
      while (!called.load()) std::this_thread::yield();
      group.agent(1).shutdown(false);
      return;
    }
    rpc::Future f =
        rpc::rpc_async("w1", "sleep", {.tensors = {}, .rrefs = {}, .bytes = "1500"}, 30);
    called = true;
    pending = error_of([&] { f.wait(); }, &message);
    later = error_of([] { rpc::rpc_sync("w1", "echo"); });
  });
  CHECK(pending == ErrorCode::ShutDown);
  CHECK_THAT(message, Catch::Contains("w1"));
  CHECK(later == ErrorCode::ShutDown);
}

}  // namespace
}  // namespace tutti::test
