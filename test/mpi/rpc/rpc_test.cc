// SPDX-License-Identifier: Apache-2.0
// The RPC agent over MPI at 1-4 ranks: calls to self and others, every error, nested chains,
// many concurrent calls, big messages and both shutdowns (cases shared with the unit tier,
// test/support/rpc_agent_cases.cc); and init_rpc()'s checks.
#include <chrono>
#include <cstddef>
#include <limits>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "test/mpi/rpc/rpc_test_util.h"
#include "test/support/error_of.h"

namespace tutti::test {
namespace {

using rpc::Message;

TEST_CASE("rpc_sync, rpc_async and remote reach every worker, this one included", "[rpc]") {
  check_on_ranks(every_worker_reached());
}

TEST_CASE("Unknown workers and functions, remote exceptions and timeouts fail the call", "[rpc]") {
  check_on_ranks(failed_calls());
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
  // Past 4096 worker threads (each is started by init_rpc()) is refused on every rank, as are
  // none; before, any count was accepted and its threads started at once.
  for (const int threads : {0, 4097, std::numeric_limits<int>::max()}) {
    message.clear();
    const auto refused = error_of(
        [&] {
          rpc::init_rpc(worker(world_rank()),
                        {.num_worker_threads = world_rank() == 0 ? threads : 2});
        },
        &message);
    INFO(threads << " threads: " << message);
    CHECK(all_ranks(refused == ErrorCode::InvalidArgument));
  }
  rpc::init_rpc(worker(world_rank()));
  const auto twice = error_of([] { rpc::init_rpc(worker(world_rank())); });
  CHECK(all_ranks(twice == ErrorCode::InvalidArgument));
  // Functions are registered before init_rpc(), on every worker.
  const auto late_register =
      error_of([] { rpc::register_function("late", [](const Message& m) { return m; }); });
  CHECK(all_ranks(late_register == ErrorCode::InvalidArgument));
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
  check_on_ranks(nested_chains());
}

TEST_CASE("1,000 concurrent rpc_async calls all complete with their own results", "[rpc]") {
  check_on_ranks(concurrent_calls());
}

TEST_CASE("rpc_sync from four threads of every worker at once: each call its own result", "[rpc]") {
  check_on_ranks(concurrent_sync_calls());
}

TEST_CASE("Big messages: 1 MiB tensors, in small pieces, and one over 64 MiB", "[rpc]") {
  const std::size_t piece = GENERATE(std::size_t{4096}, rpc::detail::kDefaultMaxPieceBytes);
  check_on_ranks(big_messages(piece));
}

TEST_CASE("Graceful shutdown waits for the calls in flight everywhere; later calls fail",
          "[rpc][shutdown]") {
  check_on_ranks(graceful_shutdown());
}

TEST_CASE("A worker that leaves fails the calls waiting on it with ShutDown", "[rpc][shutdown]") {
  check_on_ranks(worker_leaves());
}

TEST_CASE("A worker in graceful shutdown serves the others' calls for as long as they go on",
          "[rpc][shutdown]") {
  // Worker 1 (a parameter server, say) calls shutdown() at once; worker 0 calls it every 50 ms
  // for 8.5 s, past the 2 s timeout plus 5 s after which shutdown() used to give up and leave
  // (worker 0's calls then failed with ShutDown); the others call shutdown() at once too.
  RpcSetup setup;
  setup.rpc.timeout_seconds = 2;
  RpcGroup group(setup);
  std::string problem;
  if (world_rank() == 0 && world_size() > 1) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(8500);
    for (int call = 0; problem.empty() && std::chrono::steady_clock::now() < end; ++call) {
      std::string message, answer;
      const auto code = error_of(
          [&] { answer = rpc::rpc_sync(worker(1), "echo", bytes_only("x")).bytes; }, &message);
      if (code || answer != "x") problem = "call " + std::to_string(call) + ": " + message;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  rpc::shutdown();
  INFO(problem);
  CHECK(all_ranks(problem.empty()));
}

}  // namespace
}  // namespace tutti::test
