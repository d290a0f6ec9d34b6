// SPDX-License-Identifier: Apache-2.0
// The shared cases of calls (Note [Shared RPC cases] in rpc_cases.h): to every worker, every
// error, nested chains, many concurrent calls (rpc_async, and rpc_sync from several threads),
// big messages and both shutdowns.
#include <cmath>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "test/support/error_of.h"
#include "test/support/rpc_cases.h"
#include "test/support/rpc_functions.h"
#include "test/support/sanitizers.h"

namespace tutti::test {
namespace {

using rpc::Message;

// ThreadSanitizer's build skips the 68 MiB echo of big_messages(): it took 23 of the RPC
// test's 27 s there, touching fresh memory, and adds nothing for threads that the 1 MiB
// messages in 4 KiB pieces do not.
#if defined(TUTTI_THREAD_SANITIZER)
constexpr bool kEchoesHugeMessage = false;
#else
constexpr bool kEchoesHugeMessage = true;
#endif

Problems every_worker_reached_body(RpcWorld& world) {
  Problems p;
  const int rank = world.rank();
  for (int to = 0; to < world.size(); ++to) {
    const std::string dest = worker(to);
    nn::Variable a(filled({2, 3}, float(rank)), false), b(filled({2, 3}, 10.0f * float(to)), false);
    Message sum = rpc::rpc_sync(dest, "add", {.tensors = {a, b}, .rrefs = {}, .bytes = {}});
    p.expect(
        sum.tensors.size() == 1 && values_of(sum.tensors[0].value()) == values_of((a + b).value()),
        "add on " + dest);
    rpc::Future f =
        rpc::rpc_async(dest, "echo", {.tensors = {a}, .rrefs = {}, .bytes = "hi " + dest});
    Message echoed = f.wait();
    p.expect(f.done() && echoed.bytes == "hi " + dest, "echo bytes from " + dest);
    // Values are copied, also to this worker itself.
    echoed.tensors.at(0).value().span<float>()[0] = -1.0f;
    p.expect(a.value().span<float>()[0] == float(rank), "echo copied the tensor");
    rpc::RRef ref = rpc::remote(dest, "echo", {.tensors = {b}, .rrefs = {}, .bytes = "kept"});
    p.expect(ref.owner().name == dest && ref.owner().id == to && ref.is_owner() == (to == rank),
             "RRef owner of " + dest);
    Message here = ref.to_here();
    p.expect(here.bytes == "kept" && values_of(here.tensors.at(0).value()) == values_of(b.value()),
             "to_here from " + dest);
    p.expect(ref.confirmed_by_owner(), "confirmed after to_here");
    p.expect(rpc::get_worker_info(dest).id == to, "get_worker_info of " + dest);
  }
  p.expect(rpc::get_worker_info().name == worker(rank) &&
               int(rpc::get_worker_infos().size()) == world.size(),
           "worker infos");
  return p;
}

Problems failed_calls_body(RpcWorld& world) {
  Problems p;
  const std::string next = world.peer(1), me = worker(world.rank());
  std::string m;
  p.expect_error(error_of([] { rpc::rpc_async("nobody", "echo"); }, &m), ErrorCode::InvalidArgument,
                 "unknown worker");
  p.expect_contains(m, {"nobody"}, "unknown worker");
  p.expect_error(error_of([&] { rpc::rpc_sync(next, "nope"); }, &m), ErrorCode::InvalidArgument,
                 "unknown function");
  p.expect_contains(m, {"'nope'", next}, "unknown function");
  p.expect_error(error_of([&] { rpc::rpc_sync(next, "raise", bytes_only("1")); }, &m),
                 ErrorCode::Mismatch, "coded exception");
  p.expect_contains(m, {next, "coded boom", "'raise'"}, "coded exception");
  p.expect_error(error_of([&] { rpc::rpc_sync(next, "raise", bytes_only("std")); }, &m),
                 ErrorCode::Internal, "std exception");
  p.expect_contains(m, {next, "plain boom"}, "std exception");
  p.expect_error(error_of([&] { rpc::rpc_sync(me, "raise", bytes_only("std")); }, &m),
                 ErrorCode::Internal, "std exception on oneself");
  p.expect_contains(m, {me, "plain boom"}, "std exception on oneself");
  p.expect_error(error_of([&] { rpc::rpc_sync(next, "sleep", bytes_only("400"), 0.05); }, &m),
                 ErrorCode::Timeout, "timeout");
  p.expect_contains(m, {"'sleep'", next}, "timeout");
  p.expect_error(error_of([&] { rpc::remote(next, "raise", bytes_only("1")).to_here(); }, &m),
                 ErrorCode::Mismatch, "remote() exception");
  p.expect_contains(m, {"coded boom"}, "remote() exception");
  p.expect_error(
      error_of([&] { rpc::remote(next, "sleep", bytes_only("400"), 0.05).to_here(); }, &m),
      ErrorCode::Timeout, "remote() timeout");
  // The user's function, not the protocol's carrier of it ("tutti.rref.create").
  p.expect_contains(m, {"'sleep'", next}, "remote() timeout");
  p.expect(m.find("tutti.rref") == std::string::npos, "remote() timeout names " + m);
  p.expect_error(error_of([&] { rpc::rpc_sync(next, "echo", {}, INFINITY); }, &m),
                 ErrorCode::InvalidArgument, "infinite timeout");
  p.expect_contains(m, {"finite"}, "infinite timeout");
  p.expect_error(error_of([&] { rpc::rpc_sync(next, "echo", {}, -1.0); }),
                 ErrorCode::InvalidArgument, "negative timeout");
  p.expect_error(error_of([&] { rpc::rpc_sync(next, "tutti.rref.delete"); }),
                 ErrorCode::InvalidArgument, "reserved function name");
  p.expect_error(error_of([&] {
                   rpc::rpc_sync(next, "echo",
                                 {.tensors = {}, .rrefs = {rpc::RRef()}, .bytes = {}});
                 }),
                 ErrorCode::InvalidArgument, "empty RRef argument");
  if (next != me) {  // A user's RRef has no local value (an owner's has).
    p.expect_error(error_of([&] { rpc::remote(next, "echo").local_value(); }),
                   ErrorCode::InvalidArgument, "local_value() of a user");
  }
  p.expect_error(error_of([] { rpc::Future().wait(); }), ErrorCode::InvalidArgument,
                 "wait() on an empty Future");
  return p;
}

Problems nested_chains_body(RpcWorld& world) {
  // Every worker starts a chain at once; each goes round twice, back through its caller, while
  // every worker's only pool thread waits in a nested call.
  Problems p;
  std::string path, expected = world.peer(1);
  for (int hop = 1; hop <= 2 * world.size(); ++hop) {
    path += (path.empty() ? "" : ",") + world.peer(hop);
    expected += ">" + world.peer(hop);
  }
  const std::string got = rpc::rpc_sync(world.peer(1), "chain", bytes_only(path)).bytes;
  p.expect(got == expected, "chain " + got + " vs " + expected);
  return p;
}

Problems concurrent_calls_body(RpcWorld& world) {
  Problems p;
  std::vector<rpc::Future> futures;
  for (int i = 0; i < 1000; ++i) {
    futures.push_back(rpc::rpc_async(world.peer(1 + i % 3), "echo",
                                     {.tensors = {nn::Variable(filled({3}, float(i)))},
                                      .rrefs = {},
                                      .bytes = std::to_string(i)}));
  }
  int right = 0;
  for (int i = 0; i < 1000; ++i) {
    Message m = futures[static_cast<std::size_t>(i)].wait();
    right += m.bytes == std::to_string(i) &&
             values_of(m.tensors.at(0).value()) == values_of(filled({3}, float(i)));
  }
  p.expect(right == 1000, std::to_string(right) + " of 1000 calls right");
  return p;
}

// Four threads of this worker, each making 250 rpc_sync() calls in a row to every worker in
// turn (itself included), so that several callers wait, and may drive the pass, at once.
Problems concurrent_sync_calls_body(RpcWorld& world) {
  Problems p;
  constexpr int kThreads = 4;
  constexpr int kCalls = 250;
  std::vector<int> right(kThreads, 0);
  std::vector<std::string> errors(kThreads);
  rpc::detail::Agent* agent = rpc::detail::thread_agent();  // The unit tier's; null over MPI.
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const rpc::detail::AgentScope scope(agent);
      try {
        for (int i = 0; i < kCalls; ++i) {
          const std::string tag =
              std::to_string(world.rank()) + "/" + std::to_string(t) + "/" + std::to_string(i);
          const float value = float(t * kCalls + i);
          Message m = rpc::rpc_sync(
              world.peer(t + i), "echo",
              {.tensors = {nn::Variable(filled({2}, value))}, .rrefs = {}, .bytes = tag});
          right[static_cast<std::size_t>(t)] +=
              m.bytes == tag && values_of(m.tensors.at(0).value()) == values_of(filled({2}, value));
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    const auto i = static_cast<std::size_t>(t);
    p.expect(errors[i].empty(), "thread " + std::to_string(t) + " threw: " + errors[i]);
    p.expect(right[i] == kCalls, "thread " + std::to_string(t) + ": " + std::to_string(right[i]) +
                                     " of " + std::to_string(kCalls) + " calls right");
  }
  return p;
}

Problems big_messages_body(RpcWorld& world, std::size_t max_piece_bytes) {
  Problems p;
  nn::Variable mib(filled({512, 512}, float(world.rank()), 0.25f));  // 1 MiB.
  Message m = rpc::rpc_sync(world.peer(1), "echo",
                            {.tensors = {mib}, .rrefs = {}, .bytes = std::string(10000, 'x')});
  p.expect(values_of(m.tensors.at(0).value()) == values_of(mib.value()) &&
               m.bytes == std::string(10000, 'x'),
           "1 MiB echo");
  if (kEchoesHugeMessage && max_piece_bytes == rpc::detail::kDefaultMaxPieceBytes &&
      world.rank() == 0) {
    // 68 MiB: one piece at the default piece size (1 GiB), and above the mapping threshold of
    // glibc's malloc, so its buffers come from the kept ones after the first call (Note [Byte
    // buffers kept for reuse]). Once, from worker 0: fresh memory is slow to touch on the test
    // machines.
    nn::Variable huge(filled({17, 1 << 20}, 1.0f, 0.0f));
    Message h = rpc::rpc_sync(world.peer(1), "echo", {.tensors = {huge}, .rrefs = {}, .bytes = {}});
    p.expect(h.tensors.at(0).value().shape() == huge.value().shape() &&
                 max_difference(h.tensors.at(0).value(), huge.value()) == 0,
             "68 MiB echo");
  }
  return p;
}

Problems graceful_shutdown_body(RpcWorld& world) {
  Problems p;
  std::vector<rpc::Future> futures;
  for (int i = 0; i < 20; ++i) {
    futures.push_back(rpc::rpc_async(world.peer(1), "sleep", bytes_only("10")));
    futures.push_back(rpc::rpc_async(world.peer(2), "chain", bytes_only(worker(world.rank()))));
  }
  world.leave(true);  // Right away, with every call in flight.
  int fine = 0;
  for (rpc::Future& f : futures) fine += f.done() && !error_of([&] { f.wait(); });
  p.expect(fine == int(futures.size()), std::to_string(fine) + " of " +
                                            std::to_string(futures.size()) +
                                            " calls answered before shutdown returned");
  p.expect_error(error_of([&] { rpc::rpc_sync(world.peer(1), "echo"); }), ErrorCode::ShutDown,
                 "a call after shutdown");
  return p;
}

Problems worker_leaves_body(RpcWorld& world) {
  Problems p;
  if (world.size() < 2) return p;
  if (world.rank() == 0) {
    rpc::Future f = rpc::rpc_async(worker(1), "sleep", bytes_only("1500"), 30);
    world.barrier();  // Worker 1 leaves once the call is made.
    std::string m;
    p.expect_error(error_of([&] { f.wait(); }, &m), ErrorCode::ShutDown,
                   "the call waiting on the worker that left");
    p.expect_contains(m, {worker(1)}, "the call waiting on the worker that left");
    p.expect_error(error_of([] { rpc::rpc_sync(worker(1), "echo"); }), ErrorCode::ShutDown,
                   "a later call to the worker that left");
  } else {
    world.barrier();
    if (world.rank() == 1) world.leave(false);
  }
  world.barrier();  // Worker 1 left: the harness ends the others without a handshake.
  return p;
}

}  // namespace

RpcCase every_worker_reached() { return {.setup = {}, .body = every_worker_reached_body}; }

RpcCase failed_calls() { return {.setup = {}, .body = failed_calls_body}; }

RpcCase nested_chains() {
  return {.setup = {.rpc = {.timeout_seconds = 60, .num_worker_threads = 1}},
          .body = nested_chains_body};
}

RpcCase concurrent_calls() { return {.setup = {}, .body = concurrent_calls_body}; }

RpcCase concurrent_sync_calls() { return {.setup = {}, .body = concurrent_sync_calls_body}; }

RpcCase big_messages(std::size_t max_piece_bytes) {
  return {.setup = {.rpc = {}, .max_piece_bytes = max_piece_bytes},
          .body = [max_piece_bytes](RpcWorld& world) {
            return big_messages_body(world, max_piece_bytes);
          }};
}

RpcCase graceful_shutdown() { return {.setup = {}, .body = graceful_shutdown_body}; }

RpcCase worker_leaves() {
  return {.setup = {.rpc = {},
                    .max_piece_bytes = rpc::detail::kDefaultMaxPieceBytes,
                    .graceful = false},
          .body = worker_leaves_body};
}

}  // namespace tutti::test
