// SPDX-License-Identifier: Apache-2.0
// An application that initializes MPI itself at MPI_THREAD_SERIALIZED, which Tutti accepts:
// then only the communication thread calls MPI, waiting threads sleep instead of running the
// loop's cycle (Note [A waiting thread runs the cycle] in src/core/loop_driver.h), and the
// loop polls for them, yielding between polls (Note [Waiting on a shared CPU] in
// src/core/background_loop.h); a process that sees a GPU waits the same way. The application
// must make no MPI call while Tutti runs (one thread at a time), so each rank counts its wrong
// values (test/support/thread_rounds.h) and the ranks agree on them after shutdown().
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/error_of.h"
#include "test/support/mpi_catch.h"
#include "test/support/mpi_test_util.h"
#include "test/support/thread_rounds.h"
#include "tutti/rpc.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

constexpr int kThreads = 3;
constexpr int kRounds = 60;

TEST_CASE("at MPI_THREAD_SERIALIZED the communication thread runs every waiting thread's ops",
          "[serialized]") {
  const int rank = world_rank();  // MPI calls before init() and after shutdown() only.
  const int size = world_size();
  init();
  const bool multiple = mpi_threads_supported();
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([rank, size, t, &wrong] {
      wrong[static_cast<std::size_t>(t)] = run_thread_rounds(rank, size, t, kRounds);
    });
  }
  for (std::thread& thread : threads) thread.join();
  shutdown();
  CHECK(all_ranks(!multiple));
  for (int t = 0; t < kThreads; ++t) CHECK(all_ranks(wrong[static_cast<std::size_t>(t)] == 0));
}

TEST_CASE("at MPI_THREAD_SERIALIZED the RPC agent is refused with the reason", "[serialized]") {
  const std::string name = "worker" + std::to_string(world_rank());
  init();
  std::string message;
  const std::optional<ErrorCode> code = error_of([&] { rpc::init_rpc(name); }, &message);
  shutdown();
  CHECK(all_ranks(code == ErrorCode::InvalidArgument));
  CHECK(all_ranks(message.find("MPI_THREAD_MULTIPLE") != std::string::npos));
}

}  // namespace
}  // namespace tutti::test

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) MPI_Abort(MPI_COMM_WORLD, 1);
  const int code = tutti::test::agree_on_failures(tutti::test::run_catch(argc, argv));
  MPI_Finalize();
  return code;
}
