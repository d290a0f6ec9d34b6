// SPDX-License-Identifier: Apache-2.0
// Issue 23: ops on CUDA tensors wait, on the device, for the work enqueued before the call on
// the submitting thread's current stream (tutti/cuda.h; Note [Stream ordering] in
// ops/cuda/stream.h). A held producer stream writes every input, so the writes land only when
// it is released; the ops are submitted at once, must stay pending while it is held, and must
// then give the closed forms of the written values. Without the ordering they run on the
// tensors' old contents (zeros) and finish early. Built into the mpi suite over the simulated
// device (sim_main.cc) and into the gpu suite (test/gpu/producer_stream_cuda.cc).
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "test/support/device_test_util.h"
#include "test/support/mpi_test_util.h"
#include "test/support/producer_stream.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// How long the ops must stay pending while their producer is held. Without the ordering they
// finish well within it: negotiation and the copies take milliseconds.
constexpr std::chrono::milliseconds kHeld{200};

// Element i of rank r's inputs: small integers, so every sum below is exact in float32.
double input_value(int rank, std::int64_t i) { return static_cast<double>(rank + 1 + i % 3); }

std::vector<double> input_values(int rank, std::int64_t count) {
  std::vector<double> values;
  for (std::int64_t i = 0; i < count; ++i) values.push_back(input_value(rank, i));
  return values;
}

double sum_over_ranks(std::int64_t i) {
  double sum = 0;
  for (int r = 0; r < world_size(); ++r) sum += input_value(r, i);
  return sum;
}

// A float32 tensor on test_device(), zero-filled now, that `producer` fills with this rank's
// input values later.
Tensor produced(ProducerStream& producer, Shape shape) {
  Tensor tensor(DataType::Float32, std::move(shape), test_device());
  producer.write(tensor.data(),
                 encode(input_values(world_rank(), tensor.num_elements()), DataType::Float32));
  return tensor;
}

// An op in flight, and what its results must be once it is done.
struct Pending {
  std::string what;
  Handle handle;
  std::function<bool()> correct;
  // Inputs the op reads, alive until it is done. Also, freeing device memory waits for the
  // device's streams (cudaFree does, and so does the simulated device), the held one too.
  std::vector<Tensor> inputs = {};
};

// Submits one op of each kind (fused allreduces, out of place, grouped, broadcast, allgather,
// reducescatter, alltoall, rooted reduce) on inputs that `producer` writes while held.
std::vector<Pending> submit_all(ProducerStream& producer) {
  const int size = world_size();
  const int me = world_rank();
  std::vector<Pending> ops;
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1027}, std::int64_t{4099}}) {
    Tensor t = produced(producer, {n});
    ops.push_back({"allreduce n=" + std::to_string(n),
                   allreduce_async(t, "order.ar." + std::to_string(n), {.op = ReduceOp::Sum}),
                   [t, n] {
                     const std::vector<double> got = device_values(t);
                     for (std::int64_t i = 0; i < n; ++i)
                       if (got[static_cast<std::size_t>(i)] != sum_over_ranks(i)) return false;
                     return true;
                   }});
  }
  Tensor input = produced(producer, {300});
  Tensor output(DataType::Float32, {300}, test_device());
  ops.push_back({"allreduce out of place",
                 allreduce_async(input, output, "order.out", {.op = ReduceOp::Sum}),
                 [output] {
                   const std::vector<double> got = device_values(output);
                   for (std::int64_t i = 0; i < 300; ++i)
                     if (got[static_cast<std::size_t>(i)] != sum_over_ranks(i)) return false;
                   return true;
                 },
                 {input}});
  Tensor g0 = produced(producer, {7});
  Tensor g1 = produced(producer, {2, 9});
  ops.push_back({"grouped allreduce",
                 grouped_allreduce_async({g0, g1}, "order.group", {.op = ReduceOp::Sum}), [g0, g1] {
                   for (const Tensor& t : {g0, g1}) {
                     const std::vector<double> got = device_values(t);
                     for (std::size_t i = 0; i < got.size(); ++i)
                       if (got[i] != sum_over_ranks(static_cast<std::int64_t>(i))) return false;
                   }
                   return true;
                 }});
  Tensor b = produced(producer, {333});
  ops.push_back({"broadcast", broadcast_async(b, size - 1, "order.bc"),
                 [b, size] { return device_values(b) == input_values(size - 1, 333); }});
  Tensor gathered_in = produced(producer, {2, 3});
  Handle gathered = allgather_async(gathered_in, "order.ag");
  ops.push_back({"allgather",
                 gathered,
                 [gathered, size] {
                   std::vector<double> expected;
                   for (int r = 0; r < size; ++r) {
                     const std::vector<double> part = input_values(r, 6);
                     expected.insert(expected.end(), part.begin(), part.end());
                   }
                   return device_values(gathered.output()) == expected;
                 },
                 {gathered_in}});
  Tensor scattered_in = produced(producer, {4 * size});
  Handle scattered = reducescatter_async(scattered_in, "order.rs", {.op = ReduceOp::Sum});
  ops.push_back({"reducescatter",
                 scattered,
                 [scattered, me] {
                   const std::vector<double> got = device_values(scattered.output());
                   bool good = got.size() == 4;
                   for (std::int64_t i = 0; good && i < 4; ++i)
                     good = got[static_cast<std::size_t>(i)] == sum_over_ranks(4 * me + i);
                   return good;
                 },
                 {scattered_in}});
  // Rank me sends its element d to rank d, so rank me receives element me of every rank.
  Tensor exchanged_in = produced(producer, {size});
  Handle exchanged = alltoall_async(exchanged_in, {}, "order.a2a");
  ops.push_back({"alltoall",
                 exchanged,
                 [exchanged, size, me] {
                   std::vector<double> expected;
                   for (int s = 0; s < size; ++s) expected.push_back(input_value(s, me));
                   return device_values(exchanged.output()) == expected;
                 },
                 {exchanged_in}});
  Tensor r = produced(producer, {77});
  ops.push_back(
      {"reduce to rank 0", reduce_async(r, 0, "order.reduce", {.op = ReduceOp::Sum}), [r, me] {
         const std::vector<double> got = device_values(r);
         for (std::int64_t i = 0; i < 77; ++i) {
           const double expected = me == 0 ? sum_over_ranks(i) : input_value(me, i);
           if (got[static_cast<std::size_t>(i)] != expected) return false;
         }
         return true;
       }});
  return ops;
}

TEST_CASE("CUDA ops wait on the device for the current stream's writes (issue 23)",
          "[cuda][ordering]") {
  for (const std::unique_ptr<ProducerStream>& producer : producer_streams()) {
    // A session each: a runtime whose buffers grow while the producer is held frees the old
    // ones, and freeing device memory waits for every stream of the device (cudaFree), which
    // would order the later ops by accident.
    Session session;
    producer->hold();
    // Released on every way out, before the session ends: a held producer would keep the
    // runtime's stream, and so shutdown(), waiting.
    struct Release {
      ProducerStream& producer;
      ~Release() {
        try {
          producer.release();
        } catch (const std::exception&) {  // A destructor cannot report; the test fails anyway.
        }
      }
    } release_at_exit{*producer};
    std::vector<Pending> ops;
    {
      cuda::StreamGuard current(producer->handle());
      ops = submit_all(*producer);
    }
    CHECK(cuda::current_stream() == nullptr);  // The guard restored the default.
    // Nothing may finish while the inputs have not landed.
    std::string early;
    const auto deadline = std::chrono::steady_clock::now() + kHeld;
    while (early.empty() && std::chrono::steady_clock::now() < deadline) {
      for (const Pending& op : ops) {
        if (op.handle.poll()) early = op.what;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    producer->release();
    std::string wrong;
    for (Pending& op : ops) {
      op.handle.wait();
      if (wrong.empty() && !op.correct()) wrong = op.what;
    }
    INFO(producer->name() << ": finished before its inputs were written: '" << early
                          << "'; wrong result: '" << wrong << "'");
    CHECK(all_ranks(early.empty() && wrong.empty()));
  }
}

}  // namespace
}  // namespace tutti::test
