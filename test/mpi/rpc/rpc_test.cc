// SPDX-License-Identifier: Apache-2.0
// The RPC agent over MPI at 1-4 ranks: calls to self and others, every error, nested chains,
// many concurrent calls, big messages, init_rpc()'s checks and both shutdowns.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "src/rpc/rpc_runtime.h"
#include "test/mpi/rpc/rpc_test_util.h"
#include "test/support/error_of.h"

namespace tutti::test {
namespace {

using rpc::Message;

Message bytes_only(std::string bytes) {
  return Message{.tensors = {}, .rrefs = {}, .bytes = std::move(bytes)};
}

TEST_CASE("rpc_sync, rpc_async and remote reach every worker, this one included", "[rpc]") {
  RpcGroup group;
  Problems p;
  const int rank = world_rank();
  for (int to = 0; to < world_size(); ++to) {
    const std::string dest = worker(to);
    nn::Variable a(filled({2, 3}, float(rank)), false), b(filled({2, 3}, 10.0f * float(to)), false);
    Message sum = rpc::rpc_sync(dest, "add", {.tensors = {a, b}, .rrefs = {}, .bytes = {}});
    p.expect(values_of(sum.tensors.at(0).value()) == values_of((a + b).value()), "add on " + dest);
    rpc::Future f =
        rpc::rpc_async(dest, "echo", {.tensors = {a}, .rrefs = {}, .bytes = "hi " + dest});
    Message echoed = f.wait();
    p.expect(f.done() && echoed.bytes == "hi " + dest, "echo from " + dest);
    echoed.tensors.at(0).value().span<float>()[0] = -1.0f;
    p.expect(a.value().span<float>()[0] == float(rank), "echo copies");
    rpc::RRef ref = rpc::remote(dest, "echo", {.tensors = {b}, .rrefs = {}, .bytes = "kept"});
    p.expect(ref.owner().id == to && ref.is_owner() == (to == rank), "owner of " + dest);
    Message here = ref.to_here();
    p.expect(here.bytes == "kept" && values_of(here.tensors.at(0).value()) == values_of(b.value()),
             "to_here");
    p.expect(ref.confirmed_by_owner() && rpc::get_worker_info(dest).id == to,
             "confirmed, worker info");
  }
  p.expect(rpc::get_worker_info().name == worker(rank) &&
               int(rpc::get_worker_infos().size()) == world_size(),
           "infos");
  INFO(p.text());
  CHECK(all_ranks(p.ok()));
}

TEST_CASE("Unknown workers and functions, remote exceptions and timeouts fail the call", "[rpc]") {
  RpcGroup group;
  const std::string next = peer(1);
  std::string m1, m2, m3;
  const auto unknown_worker = error_of([] { rpc::rpc_async("nobody", "echo"); });
  const auto unknown_function = error_of([&] { rpc::rpc_sync(next, "nope"); }, &m1);
  const auto coded = error_of([&] { rpc::rpc_sync(next, "raise", bytes_only("1")); }, &m2);
  const auto plain = error_of([&] { rpc::rpc_sync(next, "raise", bytes_only("std")); }, &m3);
  const auto timeout = error_of([&] { rpc::rpc_sync(next, "sleep", bytes_only("400"), 0.05); });
  const auto remote_error =
      error_of([&] { rpc::remote(next, "raise", bytes_only("1")).to_here(); });
  const auto remote_timeout =
      error_of([&] { rpc::remote(next, "sleep", bytes_only("400"), 0.05).to_here(); });
  const auto late_register =
      error_of([] { rpc::register_function("late", [](const Message& m) { return m; }); });
  INFO(m1 << " | " << m2 << " | " << m3);
  CHECK(all_ranks(unknown_worker == ErrorCode::InvalidArgument));
  CHECK(all_ranks(unknown_function == ErrorCode::InvalidArgument &&
                  m1.find("'nope'") != std::string::npos));
  CHECK(all_ranks(coded == ErrorCode::Mismatch && m2.find(next) != std::string::npos &&
                  m2.find("coded boom") != std::string::npos));
  CHECK(all_ranks(plain == ErrorCode::Internal && m3.find("plain boom") != std::string::npos));
  CHECK(all_ranks(timeout == ErrorCode::Timeout));
  CHECK(all_ranks(remote_error == ErrorCode::Mismatch));
  CHECK(all_ranks(remote_timeout == ErrorCode::Timeout));
  CHECK(all_ranks(late_register == ErrorCode::InvalidArgument));
}

TEST_CASE("init_rpc() refuses duplicate names, a second init and a missing tutti::init()",
          "[rpc]") {
  const auto before_init = error_of([] { rpc::init_rpc("w"); });
  CHECK(all_ranks(before_init == ErrorCode::NotInitialized));
  tutti::init();
  register_test_functions();
  std::string message;
  if (world_size() > 1) {
    const auto duplicate =
        error_of([&] { rpc::init_rpc(world_rank() == 1 ? "w0" : worker(world_rank())); }, &message);
    INFO(message);
    CHECK(all_ranks(duplicate == ErrorCode::InvalidArgument &&
                    message.find("'w0'") != std::string::npos));
  }
  const auto empty_name =
      error_of([] { rpc::init_rpc(world_rank() == 0 ? "" : worker(world_rank())); });
  CHECK(all_ranks(empty_name == ErrorCode::InvalidArgument));
  rpc::init_rpc(worker(world_rank()));
  const auto twice = error_of([] { rpc::init_rpc(worker(world_rank())); });
  CHECK(all_ranks(twice == ErrorCode::InvalidArgument));
  CHECK(all_ranks(rpc::rpc_sync(peer(1), "echo", bytes_only("again")).bytes == "again"));
  rpc::shutdown();
  const auto after = error_of([] { rpc::rpc_sync(worker(0), "echo"); });
  CHECK(all_ranks(after == ErrorCode::ShutDown));
  // A second group in the same session works, and tutti::shutdown() ends it.
  rpc::init_rpc(worker(world_rank()), {.timeout_seconds = 30, .num_worker_threads = 2});
  CHECK(all_ranks(rpc::rpc_sync(peer(1), "echo", bytes_only("third")).bytes == "third"));
  tutti::shutdown();
  CHECK(all_ranks(error_of([] { rpc::get_worker_info(); }) == ErrorCode::ShutDown));
}

TEST_CASE("Nested calls through every worker and back never deadlock, one pool thread each",
          "[rpc]") {
  RpcGroup group({.timeout_seconds = 60, .num_worker_threads = 1});
  const int size = world_size();
  std::string path;
  std::string expected = peer(1);
  for (int hop = 1; hop <= 2 * size; ++hop) {
    path += (path.empty() ? "" : ",") + peer(hop);
    expected += ">" + peer(hop);
  }
  const std::string got = rpc::rpc_sync(peer(1), "chain", bytes_only(path)).bytes;
  INFO(got << " vs " << expected);
  CHECK(all_ranks(got == expected));
}

TEST_CASE("1,000 concurrent rpc_async calls all complete with their own results", "[rpc]") {
  RpcGroup group;
  std::vector<rpc::Future> futures;
  for (int i = 0; i < 1000; ++i) {
    futures.push_back(rpc::rpc_async(peer(1 + i % 3), "echo",
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
  CHECK(all_ranks(right == 1000));
}

TEST_CASE("Big messages: 1 MiB tensors, in small pieces, and one over 64 MiB", "[rpc]") {
  const std::size_t piece = GENERATE(std::size_t{4096}, rpc::detail::kDefaultMaxPieceBytes);
  rpc::detail::set_max_piece_bytes_for_testing(piece);
  RpcGroup group;
  rpc::detail::set_max_piece_bytes_for_testing(rpc::detail::kDefaultMaxPieceBytes);
  Problems p;
  nn::Variable mib(filled({512, 512}, float(world_rank()), 0.25f));
  Message m = rpc::rpc_sync(peer(1), "echo",
                            {.tensors = {mib}, .rrefs = {}, .bytes = std::string(10000, 'x')});
  p.expect(values_of(m.tensors.at(0).value()) == values_of(mib.value()) && m.bytes.size() == 10000,
           "1 MiB");
  if (piece != 4096 && world_rank() == 0) {
    // 68 MiB: two pieces. Once, from rank 0: fresh memory is slow to touch on the test machines.
    nn::Variable huge(filled({17, 1 << 20}, 1.0f, 0.0f));
    Message h = rpc::rpc_sync(peer(1), "echo", {.tensors = {huge}, .rrefs = {}, .bytes = {}});
    p.expect(h.tensors.at(0).value().shape() == huge.value().shape() &&
                 max_difference(h.tensors.at(0).value(), huge.value()) == 0,
             "68 MiB");
  }
  INFO(p.text());
  CHECK(all_ranks(p.ok()));
}

TEST_CASE("Graceful shutdown waits for the calls in flight everywhere", "[rpc][shutdown]") {
  std::vector<rpc::Future> futures;
  {
    RpcGroup group;
    for (int i = 0; i < 20; ++i) {
      futures.push_back(rpc::rpc_async(peer(1), "sleep", bytes_only("10")));
      futures.push_back(rpc::rpc_async(peer(2), "chain", bytes_only(peer(1))));
    }
  }  // rpc::shutdown() right away.
  bool all_fine = true;
  for (rpc::Future& f : futures)
    all_fine = all_fine && f.done() && !error_of([&] { f.wait(); }).has_value();
  CHECK(all_ranks(all_fine));
}

TEST_CASE("A worker that leaves fails the calls waiting on it with ShutDown", "[rpc][shutdown]") {
  if (world_size() < 2) return;
  tutti::init();
  register_test_functions();
  rpc::init_rpc(worker(world_rank()));
  bool ok = true;
  std::string message;
  if (world_rank() == 0) {
    rpc::Future f = rpc::rpc_async("w1", "sleep", bytes_only("1500"), 30);
    MPI_Barrier(MPI_COMM_WORLD);  // Rank 1 leaves once the call is made.
    ok = error_of([&] { f.wait(); }, &message) == ErrorCode::ShutDown &&
         message.find("w1") != std::string::npos;
    ok = ok && error_of([] { rpc::rpc_sync("w1", "echo"); }) == ErrorCode::ShutDown;
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 1) rpc::shutdown(false);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  rpc::shutdown(false);  // Rank 1 left: no graceful handshake is possible now.
  tutti::shutdown();
  INFO(message);
  CHECK(all_ranks(ok));
}

}  // namespace
}  // namespace tutti::test
