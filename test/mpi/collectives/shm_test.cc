// SPDX-License-Identifier: Apache-2.0
// The shared-memory host backend (ops/shm) at sizes that span many of its chunks: every
// allreduce dtype and op, fused batches whose tensors straddle chunk boundaries with scale
// factors and float16 conversion, out-of-place outputs, and allgather, broadcast and
// reducescatter blocks larger than a slot with uneven sizes, and the rooted reduce, gather and
// scatter likewise (issue 24). meson runs it with
// TUTTI_HOST_TRANSPORT=shm (and =mpi, which must agree). Expected values are plain MPI's
// (oracle_allreduce) or closed forms of small integers, exact in every dtype.
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/core/oracle.h"
#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// A chunk is 256 KiB: these span 1 to 5 chunks for every element size, with ragged ends.
const std::vector<Shape> kLargeShapes = {{65536 + 13}, {300007}, {257, 1031}};

TEST_CASE("allreduce of multi-chunk tensors matches plain MPI for every dtype and op", "[shm]") {
  Session session;
  const std::string failure = sweep_against_oracle(kLargeShapes, "large");
  INFO(failure);
  CHECK(all_ranks(failure.empty()));
}

TEST_CASE("a fused batch straddling chunks keeps each tensor's scale factors", "[shm]") {
  Session session;
  const int size = world_size();
  // 60 tensors of 0 to ~90,000 elements (so several per chunk and some across chunks), float32
  // and float16 (which travels as float32 and fuses with it), each with its own factors.
  std::vector<HostTensor> tensors;
  std::vector<std::vector<double>> expected;
  std::vector<Handle> handles;
  for (int i = 0; i < 60; ++i) {
    const DataType dtype = i % 3 == 0 ? DataType::Float16 : DataType::Float32;
    const std::int64_t count = (i * 7919) % 90001;
    const double prescale = 1.0 + (i % 4) * 0.5;  // Exact in binary.
    const double postscale = i % 5 == 0 ? 0.25 : 1.0;
    tensors.emplace_back(dtype, Shape{count}, world_rank() + i, false);
    expected.push_back(oracle_allreduce(tensors.back(), ReduceOp::Sum, prescale, postscale, size));
  }
  for (int i = 0; i < 60; ++i) {
    const double prescale = 1.0 + (i % 4) * 0.5;
    const double postscale = i % 5 == 0 ? 0.25 : 1.0;
    handles.push_back(tutti::allreduce_async(
        tensors[static_cast<std::size_t>(i)].view(), "batch." + std::to_string(i),
        {.op = ReduceOp::Sum, .prescale_factor = prescale, .postscale_factor = postscale}));
  }
  bool all_ok = true;
  std::string first_failure;
  for (std::size_t i = 0; i < handles.size(); ++i) {
    handles[i].wait();
    const std::string failure = tensors[i].compare(expected[i]);
    if (!failure.empty() && all_ok) first_failure = "tensor " + std::to_string(i) + ": " + failure;
    all_ok = all_ok && failure.empty();
  }
  INFO(first_failure);
  CHECK(all_ranks(all_ok));
}

TEST_CASE("out-of-place allreduce leaves the input and averages into the output", "[shm]") {
  Session session;
  const int size = world_size();
  const int rank = world_rank();
  const std::size_t n = 500009;
  std::vector<std::int32_t> input(n), output(n, -1);
  for (std::size_t i = 0; i < n; ++i) input[i] = static_cast<std::int32_t>((i % 97) * (rank + 1));
  tutti::allreduce_async(TensorView(input.data(), {static_cast<std::int64_t>(n)}),
                         TensorView(output.data(), {static_cast<std::int64_t>(n)}), "oop",
                         {.op = ReduceOp::Average})
      .wait();
  // sum over r of (i % 97)(r + 1) = (i % 97) size (size + 1) / 2; averaged and truncated.
  bool ok = true;
  for (std::size_t i = 0; i < n && ok; ++i) {
    const auto sum = static_cast<double>(i % 97) * size * (size + 1) / 2.0;
    ok = output[i] == static_cast<std::int32_t>(sum / size) &&
         input[i] == static_cast<std::int32_t>((i % 97) * (rank + 1));
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("an output overlapping its input at another address is InvalidArgument", "[shm]") {
  Session session;
  std::vector<float> buffer(16, 1.0f);
  std::string message;
  // Shifted by one element: each write would land on an input not yet read.
  CHECK(error_of(
            [&] {
              tutti::allreduce_async(TensorView(buffer.data(), {8}),
                                     TensorView(buffer.data() + 1, {8}), "overlap");
            },
            &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("output overlaps input") != std::string::npos);
  // Adjacent is not overlapping, and the same memory is in place.
  tutti::allreduce_async(TensorView(buffer.data(), {8}), TensorView(buffer.data() + 8, {8}),
                         "adjacent", {.op = ReduceOp::Sum})
      .wait();
  tutti::allreduce_async(TensorView(buffer.data(), {8}), TensorView(buffer.data(), {8}), "same",
                         {.op = ReduceOp::Sum})
      .wait();
  const auto size = static_cast<float>(world_size());
  CHECK(
      all_ranks(buffer[0] == size && buffer[7] == size && buffer[8] == size && buffer[15] == size));
}

// Rank r's element i of a gathered or broadcast tensor: distinct per rank and index.
float value(int rank, std::size_t i) { return static_cast<float>(rank * 1000003 + i % 999983); }

TEST_CASE("allgather of uneven blocks larger than a slot", "[shm]") {
  Session session;
  const int size = world_size();
  const int rank = world_rank();
  const auto rows_of = [](int r) { return static_cast<std::int64_t>(r * 40000 + 23000 + r); };
  std::vector<float> mine(static_cast<std::size_t>(rows_of(rank) * 3));
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = value(rank, i);
  const Tensor gathered = tutti::allgather(TensorView(mine.data(), {rows_of(rank), 3}), "gather");
  std::int64_t rows = 0;
  for (int r = 0; r < size; ++r) rows += rows_of(r);
  bool ok = gathered.shape() == Shape{rows, 3};
  const auto* got = static_cast<const float*>(gathered.data());
  std::size_t at = 0;
  for (int r = 0; r < size && ok; ++r) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(rows_of(r) * 3) && ok; ++i, ++at)
      ok = got[at] == value(r, i);
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("broadcast of several slots from every root", "[shm]") {
  Session session;
  const int size = world_size();
  const int rank = world_rank();
  for (int root = 0; root < size; ++root) {
    std::vector<float> data(700001);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = value(rank, i);
    tutti::broadcast(TensorView(data.data(), {700001}), root, "bcast");
    bool ok = true;
    for (std::size_t i = 0; i < data.size() && ok; ++i) ok = data[i] == value(root, i);
    INFO("root " << root);
    CHECK(all_ranks(ok));
  }
}

TEST_CASE("reducescatter of blocks larger than a share, rows split unevenly", "[shm]") {
  Session session;
  const int size = world_size();
  const int rank = world_rank();
  const std::int64_t rows = static_cast<std::int64_t>(size) * 70001 + size - 1;  // Uneven.
  const std::int64_t cols = 3;
  std::vector<double> input(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < input.size(); ++i)
    input[i] = static_cast<double>((i % 1009) + static_cast<std::size_t>(rank));
  const Tensor out =
      tutti::reducescatter(TensorView(input.data(), {rows, cols}), "rs", {.op = ReduceOp::Sum});
  // API.md's split: rank r gets rows [r q + min(r, m), ...), q = rows / size, m = rows % size.
  const std::int64_t q = rows / size;
  const std::int64_t m = rows % size;
  const std::int64_t first = rank * q + std::min<std::int64_t>(rank, m);
  const std::int64_t mine = q + (rank < m ? 1 : 0);
  bool ok = out.shape() == Shape{mine, cols};
  const auto* got = static_cast<const double*>(out.data());
  for (std::int64_t i = 0; i < mine * cols && ok; ++i) {
    const auto global = static_cast<std::size_t>(first * cols + i);
    // sum over ranks r of (global % 1009) + r.
    const double expected =
        static_cast<double>(global % 1009) * size + static_cast<double>(size * (size - 1)) / 2;
    ok = got[i] == expected;
  }
  CHECK(all_ranks(ok));
}

// Issue 24's rooted algorithms: the root alone receives (reduce, gather) or sends (scatter).

TEST_CASE("reduce of multi-chunk and one-chunk tensors: every dtype and op, only the root changes",
          "[shm][rooted]") {
  Session session;
  const int root = world_size() - 1;
  std::string first_failure;
  for (DataType dtype : kAllDtypes) {
    for (ReduceOp op :
         {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
      if (dtype == DataType::Bool && op != ReduceOp::Min && op != ReduceOp::Max) continue;
      for (const Shape& shape : std::vector<Shape>{{1000}, {300007}}) {
        // Sum also with scale factors: the non-roots then prescale a copy, never their input.
        for (double prescale :
             op == ReduceOp::Sum ? std::vector<double>{1.0, 0.5} : std::vector<double>{1.0}) {
          HostTensor t(dtype, shape, world_rank(), op == ReduceOp::Product);
          const std::vector<double> mine = t.values();
          const double postscale = op == ReduceOp::Sum || op == ReduceOp::Average ? 2.0 : 1.0;
          const std::vector<double> reduced =
              oracle_allreduce(t, op, prescale, postscale, world_size());
          tutti::reduce(t.view(), root, "reduce",
                        {.op = op, .prescale_factor = prescale, .postscale_factor = postscale});
          const std::string failure = t.compare(world_rank() == root ? reduced : mine);
          if (!failure.empty() && first_failure.empty()) {
            first_failure = std::string(to_string(dtype)) + " " + std::string(to_string(op)) +
                            ", " + std::to_string(t.count()) + " elements: " + failure;
          }
        }
      }
    }
  }
  INFO(first_failure);
  CHECK(all_ranks(first_failure.empty()));
}

TEST_CASE("reduce: a fused batch straddling chunks at every root", "[shm][rooted]") {
  Session session;
  const int size = world_size();
  bool all_ok = true;
  for (int root = 0; root < size; ++root) {
    std::vector<HostTensor> tensors;
    std::vector<std::vector<double>> expected;
    std::vector<Handle> handles;
    for (int i = 0; i < 30; ++i) {
      const DataType dtype = i % 3 == 0 ? DataType::Float16 : DataType::Float32;
      tensors.emplace_back(dtype, Shape{(i * 7919) % 90001}, world_rank() + i, false);
      const std::vector<double> mine = tensors.back().values();
      const std::vector<double> sum =
          oracle_allreduce(tensors.back(), ReduceOp::Sum, 1.0, 1.0, size);
      expected.push_back(world_rank() == root ? sum : mine);
    }
    for (int i = 0; i < 30; ++i) {
      handles.push_back(tutti::reduce_async(tensors[static_cast<std::size_t>(i)].view(), root,
                                            "batch." + std::to_string(i), {.op = ReduceOp::Sum}));
    }
    wait_all(handles);
    for (std::size_t i = 0; i < tensors.size(); ++i)
      all_ok = all_ok && tensors[i].compare(expected[i]).empty();
  }
  CHECK(all_ranks(all_ok));
}

TEST_CASE("gather and scatter of uneven blocks larger than a slot, at every root",
          "[shm][rooted]") {
  Session session;
  const int size = world_size();
  const int rank = world_rank();
  const auto rows_of = [](int r) { return static_cast<std::int64_t>(r * 40000 + 23000 + r); };
  std::int64_t rows = 0;
  for (int r = 0; r < size; ++r) rows += rows_of(r);
  for (int root = 0; root < size; ++root) {
    std::vector<float> mine(static_cast<std::size_t>(rows_of(rank) * 3));
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = value(rank, i);
    const Tensor gathered =
        tutti::gather(TensorView(mine.data(), {rows_of(rank), 3}), root, "gather");
    bool ok = rank == root ? gathered.shape() == Shape{rows, 3} : gathered.data() == nullptr;
    const auto* got = static_cast<const float*>(gathered.data());
    std::size_t at = 0;
    for (int r = 0; r < size && ok && rank == root; ++r) {
      for (std::size_t i = 0; i < static_cast<std::size_t>(rows_of(r) * 3) && ok; ++i, ++at)
        ok = got[at] == value(r, i);
    }
    // scatter: the root's rows, rows_of(r) of them to rank r (the same layout back).
    std::vector<float> all;
    if (rank == root) {
      for (int r = 0; r < size; ++r)
        for (std::size_t i = 0; i < static_cast<std::size_t>(rows_of(r) * 3); ++i)
          all.push_back(value(r, i));
    }
    std::vector<std::int64_t> splits;
    for (int r = 0; r < size; ++r) splits.push_back(rows_of(r));
    const Tensor part = tutti::scatter(rank == root ? TensorView(all.data(), {rows, 3})
                                                    : TensorView(nullptr, DataType::Float32, {0}),
                                       root, splits, "scatter");
    ok = ok && part.shape() == Shape{rows_of(rank), 3};
    for (std::size_t i = 0; i < mine.size() && ok; ++i) ok = part.span<float>()[i] == mine[i];
    INFO("root " << root);
    CHECK(all_ranks(ok));
  }
}

}  // namespace
}  // namespace tutti::test
