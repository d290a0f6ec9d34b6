// SPDX-License-Identifier: Apache-2.0
// Every error of API.md's allreduce part: argument errors from the call, cross-rank
// disagreements as Mismatch on every rank (and the runtime usable afterwards), states before
// init() and after shutdown(), re-init, and malformed settings.
#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

bool sum_works() {
  std::vector<float> v(5, 1.0f);
  allreduce(TensorView(v.data(), {5}), "after.error", {.op = ReduceOp::Sum});
  return v[4] == static_cast<float>(world_size());
}

TEST_CASE("before init, queries throw NotInitialized and ops too", "[errors]") {
  CHECK_FALSE(is_initialized());
  CHECK(error_of([] { static_cast<void>(rank()); }) == ErrorCode::NotInitialized);
  std::vector<float> v(1);
  CHECK(error_of([&] { allreduce_async(TensorView(v.data(), {1})); }) == ErrorCode::NotInitialized);
  static_cast<void>(cuda_built());  // Compile-time facts: callable any time.
  static_cast<void>(nccl_built());
}

TEST_CASE("init reports its place in the job", "[errors]") {
  init();
  CHECK(all_ranks(rank() == world_rank() && size() == world_size()));
  CHECK(all_ranks(local_size() >= 1 && local_rank() < local_size() && cross_rank() < cross_size()));
  CHECK(all_ranks(ProcessSet::global().size() == world_size() &&
                  ProcessSet::global().rank() == world_rank()));
  shutdown();
}

TEST_CASE("argument errors are thrown by the call", "[errors]") {
  init();
  std::vector<float> v(4);
  std::vector<double> d(4);
  std::vector<std::uint8_t> flags(4);
  TensorView t(v.data(), {4});
  std::string message;
  if (world_size() > 1) {
    // "dup" is held in flight deterministically: the other ranks submit it only after rank 0's
    // checks (alone, an op may complete before the second call, so np=1 skips this).
    Handle first;
    if (world_rank() == 0) {
      first = allreduce_async(t, "dup");
      CHECK(error_of([&] { allreduce_async(t, "dup"); }, &message) == ErrorCode::InvalidArgument);
      CHECK(message.find("'dup'") != std::string::npos);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() != 0) first = allreduce_async(t, "dup");
    first.wait();
  }
  CHECK(error_of([&] { allreduce_async(TensorView(flags.data(), DataType::Bool, {4}), "b"); }) ==
        ErrorCode::InvalidArgument);
  // Bool with Max is fine, but not scaled (before, a factor turned each element into
  // x * factor != 0, unlike the integers' truncation).
  CHECK(error_of(
            [&] {
              allreduce_async(TensorView(flags.data(), DataType::Bool, {4}), "b.scaled",
                              {.op = ReduceOp::Max, .prescale_factor = 0.5});
            },
            &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("bool tensors take no scale factors (prescale 0.5, postscale 1)") !=
        std::string::npos);
  CHECK(error_of([&] {
          reduce_async(TensorView(flags.data(), DataType::Bool, {4}), 0, "b.reduce",
                       {.op = ReduceOp::Min, .postscale_factor = 0.0});
        }) == ErrorCode::InvalidArgument);
  CHECK(error_of([&] { allreduce_async(t, TensorView(d.data(), {4}), "oop"); }) ==
        ErrorCode::InvalidArgument);
  CHECK(error_of([&] { allreduce_async(t, "p", {.process_set = ProcessSet(42)}); }) ==
        ErrorCode::InvalidArgument);
  CHECK(error_of([&] { grouped_allreduce_async({}, "g"); }) == ErrorCode::InvalidArgument);
  CHECK(error_of([&] { broadcast_async(t, world_size(), "root"); }) == ErrorCode::InvalidArgument);
  CHECK(error_of([&] { Handle().wait(); }) == ErrorCode::InvalidArgument);
  // Values outside an enum class's list (it holds any value of its underlying type) are refused
  // by the call; before, an unknown ReduceOp or device kind reached the coordinator, which took
  // the request for a corrupt message and stopped the job (at one rank: a failed check).
  const auto unknown_op = static_cast<ReduceOp>(42);
  CHECK(error_of([&] { allreduce_async(t, "op42", {.op = unknown_op}); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("unknown ReduceOp 42") != std::string::npos);
  CHECK(error_of([&] { reduce_async(t, 0, "op42.reduce", {.op = unknown_op}); }) ==
        ErrorCode::InvalidArgument);
  const Device unknown_device{static_cast<Device::Kind>(7), 0};
  CHECK(error_of([&] { TensorView(v.data(), DataType::Float32, {4}, unknown_device); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("unknown Device kind 7") != std::string::npos);
  CHECK(error_of([&] { Tensor(DataType::Float32, {4}, unknown_device); }) ==
        ErrorCode::InvalidArgument);
  CHECK(all_ranks(sum_works()));
  shutdown();
}

TEST_CASE("names starting with tutti. are refused for user ops", "[errors]") {
  // Before this was refused, rank 1's allreduce named "tutti.join" completed rank 0's join().
  init();
  std::vector<float> v(4, 1.0f);
  TensorView t(v.data(), {4});
  std::string message;
  CHECK(error_of([&] { allreduce_async(t, "tutti.join"); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("reserved") != std::string::npos);
  CHECK(error_of([&] { broadcast_async(t, 0, "tutti.process_set.0"); }) ==
        ErrorCode::InvalidArgument);
  CHECK(error_of([&] { allgather_async(t, "tutti.x"); }) == ErrorCode::InvalidArgument);
  CHECK(error_of([&] { grouped_allreduce_async({t}, "tutti."); }) == ErrorCode::InvalidArgument);
  // Nothing was submitted: a join and a sum still work and agree.
  const int last_joined = join();
  CHECK((last_joined >= 0 && last_joined < world_size()));
  CHECK(all_ranks(sum_works()));
  shutdown();
}

TEST_CASE("ranks that disagree get Mismatch on every rank, naming both values", "[errors]") {
  if (world_size() < 2) return;
  init();
  const int last = world_size() - 1;
  const bool odd = world_rank() == last;
  std::vector<float> a(68), b(68);
  std::vector<std::int32_t> ints(68);

  std::string message;
  auto shape = error_of(
      [&] {
        allreduce(TensorView(a.data(), {17, odd ? 4 : 3}), "grad.fc1");
      },
      &message);
  const std::string expected =
      "Mismatched ALLREDUCE tensor shapes for 'grad.fc1': rank 0 sent [17, 3], rank " +
      std::to_string(last) + " sent [17, 4]";
  CHECK(all_ranks(shape == ErrorCode::Mismatch && message == expected));
  CHECK(all_ranks(sum_works()));

  auto dtype = error_of(
      [&] {
        if (odd)
          allreduce(TensorView(ints.data(), {5}), "dtype");
        else
          allreduce(TensorView(a.data(), {5}), "dtype");
      },
      &message);
  CHECK(all_ranks(dtype == ErrorCode::Mismatch && message.find("data types") != std::string::npos &&
                  message.find("int32") != std::string::npos &&
                  message.find("float32") != std::string::npos));

  auto op = error_of(
      [&] {
        allreduce(TensorView(a.data(), {5}), "op", {.op = odd ? ReduceOp::Max : ReduceOp::Sum});
      },
      &message);
  CHECK(all_ranks(op == ErrorCode::Mismatch && message.find("SUM") != std::string::npos &&
                  message.find("MAX") != std::string::npos));

  // Factors that differ print differently, each as the shortest text that reads back as it (an
  // ostream's 6 digits printed both of these as 0.333333).
  auto scale = error_of(
      [&] {
        allreduce(TensorView(a.data(), {5}), "scale",
                  {.prescale_factor = odd ? 0.333333 : 1.0 / 3});
      },
      &message);
  CHECK(all_ranks(scale == ErrorCode::Mismatch &&
                  message == "Mismatched ALLREDUCE prescale factors for 'scale': rank 0 sent "
                             "0.3333333333333333, rank " +
                                 std::to_string(last) + " sent 0.333333"));

  auto kind = error_of(
      [&] {
        if (odd)
          broadcast(TensorView(a.data(), {5}), 0, "kind");
        else
          allreduce(TensorView(a.data(), {5}), "kind");
      },
      &message);
  CHECK(all_ranks(kind == ErrorCode::Mismatch && message.find("BROADCAST") != std::string::npos));

  auto group = error_of(
      [&] {
        std::vector<TensorView> views = {TensorView(a.data(), {5})};
        if (odd) views.push_back(TensorView(b.data(), {5}));
        grouped_allreduce(views, "group");
      },
      &message);
  CHECK(all_ranks(group == ErrorCode::Mismatch));
  CHECK(all_ranks(sum_works()));
  shutdown();
}

TEST_CASE("after shutdown pending ops fail with ShutDown, new ones too, and init works again",
          "[errors]") {
  init();
  std::vector<float> v(3, 1.0f);
  // Only the last rank submits: nobody else ever will, so shutdown must fail it, not hang.
  Handle lonely;
  if (world_size() > 1 && world_rank() == world_size() - 1)
    lonely = allreduce_async(TensorView(v.data(), {3}), "lonely");
  MPI_Barrier(MPI_COMM_WORLD);
  // Threads that asked before shutdown() keep their answer (Note [Queries without the lock] in
  // src/core/runtime.cc) only while the session lasts: this one and another.
  const int size_before = size();
  std::atomic<int> stage{0};
  int other_size = -1;
  std::optional<ErrorCode> other_after;
  std::thread other([&] {
    other_size = size();
    stage.store(1);
    while (stage.load() != 2) std::this_thread::yield();
    other_after = error_of([] { static_cast<void>(rank()); });
  });
  while (stage.load() != 1) std::this_thread::yield();
  shutdown();
  stage.store(2);
  other.join();
  CHECK(size_before == world_size());
  CHECK(other_size == world_size());
  CHECK(other_after == ErrorCode::NotInitialized);
  CHECK(all_ranks(world_size() == 1 || world_rank() != world_size() - 1 ||
                  error_of([&] { lonely.wait(); }) == ErrorCode::ShutDown));
  CHECK(error_of([&] { allreduce_async(TensorView(v.data(), {3}), "late"); }) ==
        ErrorCode::ShutDown);
  CHECK(error_of([] { static_cast<void>(size()); }) == ErrorCode::NotInitialized);
  shutdown();  // Idempotent.
  init();
  CHECK(all_ranks(rank() == world_rank() && size() == world_size() && sum_works()));
  shutdown();
}

TEST_CASE("a malformed setting fails init naming the variable", "[errors]") {
  // Knobs no meson variant of this test sets, so TUTTI_ values cannot mask the bad ones.
  setenv("TUTTI_CYCLE_TIME", "12x", 1);
  std::string message;
  const auto cycle = error_of([] { init(); }, &message);
  if (!cycle) shutdown();
  CHECK(cycle == ErrorCode::InvalidArgument);
  CHECK(message.find("TUTTI_CYCLE_TIME") != std::string::npos);
  unsetenv("TUTTI_CYCLE_TIME");
  setenv("HOROVOD_LOG_HIDE_TIME", "lots", 1);
  const auto hide = error_of([] { init(); }, &message);
  if (!hide) shutdown();
  CHECK(hide == ErrorCode::InvalidArgument);
  CHECK(message.find("HOROVOD_LOG_HIDE_TIME") != std::string::npos);
  unsetenv("HOROVOD_LOG_HIDE_TIME");
  CHECK_FALSE(is_initialized());
}

}  // namespace
}  // namespace tutti::test
