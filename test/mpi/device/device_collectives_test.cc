// SPDX-License-Identifier: Apache-2.0
// The public collectives over CUDA tensors (core's device path: device fusion buffer, batched
// copies, device backends per set and stream, completion by event) at 1-4 ranks. Built twice:
// in the mpi suite over the simulated device (sim_main.cc), where ranks share it through the
// host-staged MPI backend, and in the gpu suite over the GPU (test/gpu), where ranks get NCCL
// when each has a GPU and host staging when they share one. Expected values are closed forms.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/support/device_test_util.h"
#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// Rank r's element i: small integers, so float16 sums stay exact.
double value(int rank, std::int64_t i) { return static_cast<double>((i + 2 * rank) % 5); }

std::vector<double> rank_values(int rank, std::int64_t first, std::int64_t count) {
  std::vector<double> out;
  for (std::int64_t i = 0; i < count; ++i) out.push_back(value(rank, first + i));
  return out;
}

// Collects the first failure of a test case; every rank asserts all_ranks(ok) at the end
// (Note [Collective assertions]).
struct Checks {
  bool ok = true;
  std::string first;
  void operator()(bool good, const std::string& what) {
    if (!good && ok) first = what;
    ok = ok && good;
  }
};

struct ReduceCase {
  DataType dtype;
  ReduceOp op;
  double prescale, postscale;
};

const ReduceCase kReduceCases[] = {
    {DataType::Float32, ReduceOp::Average, 1.0, 1.0}, {DataType::Float32, ReduceOp::Sum, 0.5, 3.0},
    {DataType::Float16, ReduceOp::Average, 1.0, 1.0}, {DataType::BFloat16, ReduceOp::Sum, 1.0, 1.0},
    {DataType::Float64, ReduceOp::Min, 1.0, 1.0},     {DataType::Int32, ReduceOp::Max, 1.0, 1.0},
    {DataType::Int32, ReduceOp::Average, 1.0, 1.0},   {DataType::Int64, ReduceOp::Sum, 1.0, 1.0},
    {DataType::UInt8, ReduceOp::Product, 1.0, 1.0},   {DataType::Int16, ReduceOp::Sum, 2.0, 1.0}};

// The closed form of element i of an allreduce of rank_values over `size` ranks.
double reduced(const ReduceCase& c, int size, std::int64_t i) {
  double expected = c.op == ReduceOp::Product ? 1.0 : 0.0;
  if (c.op == ReduceOp::Min) expected = 1e9;
  if (c.op == ReduceOp::Max) expected = -1e9;
  for (int r = 0; r < size; ++r) {
    const double x = value(r, i) * c.prescale;
    if (c.op == ReduceOp::Sum || c.op == ReduceOp::Average) expected += x;
    if (c.op == ReduceOp::Min) expected = std::min(expected, x);
    if (c.op == ReduceOp::Max) expected = std::max(expected, x);
    if (c.op == ReduceOp::Product) expected *= x;
  }
  expected = expected * c.postscale / (c.op == ReduceOp::Average ? size : 1);
  const bool scaled = c.op == ReduceOp::Average || c.prescale != 1.0 || c.postscale != 1.0;
  if (!is_floating(c.dtype) && scaled) expected = std::trunc(expected);
  return expected;
}

bool close_to(double got, double expected, DataType dtype) {
  const double tolerance = is_floating(dtype) ? 1e-2 * std::max(1.0, std::abs(expected)) : 0.0;
  return std::abs(got - expected) <= tolerance;
}

std::string describe(const ReduceCase& c, std::int64_t n) {
  return std::string(to_string(c.dtype)) + " " + std::string(to_string(c.op)) +
         " n=" + std::to_string(n);
}

TEST_CASE("allreduce of CUDA tensors: every op, scale factors, float16 and integers",
          "[cuda][allreduce]") {
  Session session;
  const int size = world_size();
  Checks check;
  for (const ReduceCase& c : kReduceCases) {
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1027}}) {
      Tensor t = device_tensor(rank_values(world_rank(), 0, n), c.dtype, {n});
      allreduce(t, "ar",
                {.op = c.op, .prescale_factor = c.prescale, .postscale_factor = c.postscale});
      const std::vector<double> got = device_values(t);
      bool good = true;
      for (std::int64_t i = 0; i < n; ++i)
        good = good && close_to(got[static_cast<std::size_t>(i)], reduced(c, size, i), c.dtype);
      check(good, describe(c, n));
    }
  }
  INFO(check.first);
  CHECK(all_ranks(check.ok));
}

TEST_CASE("many async allreduces of CUDA tensors fuse, out of place and in place",
          "[cuda][allreduce][fusion]") {
  Session session;
  const int size = world_size();
  const int me = world_rank();
  // Every case twice over sizes that straddle a small fusion threshold; half out of place.
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<const ReduceCase*> cases;
  std::vector<Handle> handles;
  for (int round = 0; round < 2; ++round) {
    for (const ReduceCase& c : kReduceCases) {
      const std::int64_t n = 1 + static_cast<std::int64_t>(cases.size()) * 97;
      Tensor input = device_tensor(rank_values(me, 0, n), c.dtype, {n});
      Tensor output = cases.size() % 2 == 0 ? input : Tensor(c.dtype, {n}, test_device());
      handles.push_back(allreduce_async(
          input, output, "fused." + std::to_string(cases.size()),
          {.op = c.op, .prescale_factor = c.prescale, .postscale_factor = c.postscale}));
      inputs.push_back(input);
      outputs.push_back(output);
      cases.push_back(&c);
    }
  }
  Checks check;
  for (std::size_t k = 0; k < handles.size(); ++k) {
    handles[k].wait();
    const std::vector<double> got = device_values(outputs[k]);
    bool good = true;
    for (std::size_t i = 0; i < got.size(); ++i) {
      good = good && close_to(got[i], reduced(*cases[k], size, static_cast<std::int64_t>(i)),
                              cases[k]->dtype);
    }
    check(good, describe(*cases[k], static_cast<std::int64_t>(got.size())));
    if (outputs[k].data() != inputs[k].data()) {
      check(device_values(inputs[k]) == rank_values(me, 0, inputs[k].num_elements()),
            "out-of-place input changed");
    }
  }
  INFO(check.first);
  CHECK(all_ranks(check.ok));
}

TEST_CASE("grouped allreduce of mixed-dtype CUDA tensors", "[cuda][allreduce]") {
  Session session;
  const int size = world_size();
  std::vector<Tensor> tensors = {
      device_tensor(rank_values(world_rank(), 0, 5), DataType::Float32, {5}),
      device_tensor(rank_values(world_rank(), 0, 300), DataType::Float16, {300}),
      device_tensor(rank_values(world_rank(), 0, 17), DataType::Int64, {17})};
  grouped_allreduce({tensors[0], tensors[1], tensors[2]}, "group", {.op = ReduceOp::Sum});
  bool ok = true;
  for (const Tensor& t : tensors) {
    const std::vector<double> got = device_values(t);
    for (std::size_t i = 0; i < got.size(); ++i) {
      double expected = 0;
      for (int r = 0; r < size; ++r) expected += value(r, static_cast<std::int64_t>(i));
      ok = ok && got[i] == expected;
    }
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("allgather, broadcast, alltoall and reducescatter of CUDA tensors", "[cuda]") {
  Session session;
  const int size = world_size();
  const int me = world_rank();
  Checks check;

  // allgather: rank r contributes r + 1 rows of 3.
  const Tensor gathered = allgather(
      device_tensor(rank_values(me, 0, 3 * (me + 1)), DataType::Float32, {me + 1, 3}), "ag");
  std::vector<double> expected;
  for (int r = 0; r < size; ++r) {
    const std::vector<double> part = rank_values(r, 0, 3 * (r + 1));
    expected.insert(expected.end(), part.begin(), part.end());
  }
  check(gathered.device() == test_device() && device_values(gathered) == expected, "allgather");

  // grouped allgather of two dtypes (one fused allgatherv of bytes).
  const std::vector<Tensor> group =
      grouped_allgather_async(
          {device_tensor(rank_values(me, 0, 2 * (me + 1)), DataType::Int16, {me + 1, 2}),
           device_tensor(rank_values(me, 1, 1), DataType::Float64, {1})},
          "gag")
          .outputs();
  std::vector<double> shorts;
  std::vector<double> doubles;
  for (int r = 0; r < size; ++r) {
    const std::vector<double> part = rank_values(r, 0, 2 * (r + 1));
    shorts.insert(shorts.end(), part.begin(), part.end());
    doubles.push_back(value(r, 1));
  }
  check(
      group.size() == 2 && device_values(group[0]) == shorts && device_values(group[1]) == doubles,
      "grouped allgather");

  // broadcast from the last rank.
  Tensor b = device_tensor(rank_values(me, 0, 999), DataType::Int32, {999});
  broadcast(b, size - 1, "bc");
  check(device_values(b) == rank_values(size - 1, 0, 999), "broadcast");

  // alltoall: equal splits of 2 rows per rank; rows tagged by sender.
  std::vector<double> rows;
  for (int d = 0; d < size; ++d)
    rows.insert(rows.end(), {double(me * 10 + d), double(me * 10 + d)});
  const AlltoallResult a2a =
      alltoall(device_tensor(rows, DataType::Float64, {2 * size}), {}, "a2a");
  std::vector<double> received;
  for (int s = 0; s < size; ++s)
    received.insert(received.end(), {double(s * 10 + me), double(s * 10 + me)});
  check(device_values(a2a.output) == received, "alltoall");
  check(a2a.received_splits == std::vector<std::int64_t>(static_cast<std::size_t>(size), 2),
        "alltoall splits");

  // reducescatter alone (straight into the output) and grouped with Average (packed):
  // 2 * size + 1 rows, split as API.md says.
  const std::int64_t n = 2 * size + 1;
  const std::int64_t q = n / size;
  const std::int64_t m = n % size;
  const std::int64_t first_row = me * q + std::min<std::int64_t>(me, m);
  const std::int64_t rows_mine = q + (me < m ? 1 : 0);
  std::vector<double> sums;
  for (std::int64_t i = first_row; i < first_row + rows_mine; ++i) {
    double s = 0;
    for (int r = 0; r < size; ++r) s += value(r, i);
    sums.push_back(s);
  }
  const Tensor scattered = reducescatter(
      device_tensor(rank_values(me, 0, n), DataType::Float32, {n}), "rs", {.op = ReduceOp::Sum});
  check(device_values(scattered) == sums, "reducescatter");
  const std::vector<Tensor> averaged =
      grouped_reducescatter_async({device_tensor(rank_values(me, 0, n), DataType::Float64, {n}),
                                   device_tensor(rank_values(me, 0, n), DataType::Float16, {n})},
                                  "grs", {.op = ReduceOp::Average})
          .outputs();
  bool good = averaged.size() == 2;
  for (const Tensor& t : averaged) {
    const std::vector<double> got = device_values(t);
    good = good && got.size() == sums.size();
    for (std::size_t i = 0; good && i < got.size(); ++i)
      good = close_to(got[i], sums[i] / size, t.dtype());
  }
  check(good, "grouped reducescatter");
  INFO(check.first);
  CHECK(all_ranks(check.ok));
}

TEST_CASE("reduce, gather and scatter of CUDA tensors at every root", "[cuda][rooted]") {
  Session session;
  const int size = world_size();
  const int me = world_rank();
  Checks check;
  for (int root = 0; root < size; ++root) {
    const std::string at = " root " + std::to_string(root);
    // reduce: only the root's tensor changes.
    for (const ReduceCase& c : kReduceCases) {
      const std::vector<double> mine = rank_values(me, 0, 1027);
      Tensor t = device_tensor(mine, c.dtype, {1027});
      reduce(t, root, "rd",
             {.op = c.op, .prescale_factor = c.prescale, .postscale_factor = c.postscale});
      const std::vector<double> got = device_values(t);
      bool good = true;
      for (std::int64_t i = 0; i < 1027; ++i) {
        const double expected =
            me == root ? reduced(c, size, i) : mine[static_cast<std::size_t>(i)];
        good = good && close_to(got[static_cast<std::size_t>(i)], expected, c.dtype);
      }
      check(good, "reduce " + describe(c, 1027) + at);
    }
    // gather: rank r gives r rows of 3 (rank 0 none).
    const Tensor gathered =
        gather(device_tensor(rank_values(me, 0, 3 * me), DataType::Float32, {me, 3}), root, "ga");
    if (me == root) {
      std::vector<double> expected;
      for (int r = 0; r < size; ++r) {
        const std::vector<double> part = rank_values(r, 0, 3 * r);
        expected.insert(expected.end(), part.begin(), part.end());
      }
      check(gathered.device() == test_device() && device_values(gathered) == expected &&
                gathered.shape() == Shape{size * (size - 1) / 2, 3},
            "gather" + at);
    } else {
      check(gathered.num_elements() == 0 && gathered.data() == nullptr, "gather non-root" + at);
    }
    // scatter: set-rank i gets i rows of 2 (set-rank 0 none) of the root's rows 0, 1, ...
    std::vector<std::int64_t> splits;
    std::int64_t rows = 0;
    for (int i = 0; i < size; ++i) {
      splits.push_back(i);
      rows += i;
    }
    std::vector<double> input;
    for (std::int64_t k = 0; k < 2 * rows; ++k) input.push_back(static_cast<double>(k % 97));
    const Tensor part = scatter(me == root ? device_tensor(input, DataType::Int32, {rows, 2})
                                           : device_tensor({}, DataType::Int32, {0}),
                                root, splits, "sc");
    const std::int64_t first = me * (me - 1) / 2;
    std::vector<double> expected(input.begin() + 2 * first, input.begin() + 2 * (first + me));
    check(part.device() == test_device() && part.shape() == Shape{me, 2} &&
              device_values(part) == expected,
          "scatter" + at);
  }
  INFO(check.first);
  CHECK(all_ranks(check.ok));
}

TEST_CASE("CUDA collectives on a process set, and after it is removed", "[cuda][process_set]") {
  if (world_size() < 2) return;  // The even ranks would be the global set.
  Session session;
  const int size = world_size();
  const int me = world_rank();
  // The even ranks: the set's own device backend, created at its first device op.
  std::vector<int> evens;
  for (int r = 0; r < size; r += 2) evens.push_back(r);
  ProcessSet set = add_process_set(evens);
  Checks check;
  if (me % 2 == 0) {
    Tensor t = device_tensor(rank_values(me, 0, 64), DataType::Float32, {64});
    allreduce(t, "set.ar", {.op = ReduceOp::Sum, .process_set = set});
    std::vector<double> expected(64, 0.0);
    for (int r : evens) {
      for (std::int64_t i = 0; i < 64; ++i) expected[static_cast<std::size_t>(i)] += value(r, i);
    }
    check(device_values(t) == expected, "allreduce on the even ranks");
  }
  remove_process_set(set);
  // The global set still works after the removal dropped the set's device backend.
  Tensor t = device_tensor(rank_values(me, 0, 8), DataType::Float32, {8});
  allreduce(t, "after.removal", {.op = ReduceOp::Max});
  std::vector<double> expected(8, -1.0);
  for (int r = 0; r < size; ++r) {
    for (std::int64_t i = 0; i < 8; ++i)
      expected[static_cast<std::size_t>(i)] =
          std::max(expected[static_cast<std::size_t>(i)], value(r, i));
  }
  check(device_values(t) == expected, "allreduce after removal");
  INFO(check.first);
  CHECK(all_ranks(check.ok));
}

TEST_CASE("a joined rank contributes zeros to CUDA allreduces", "[cuda][join]") {
  Session session;
  const int size = world_size();
  const int me = world_rank();
  // The last rank joins at once; the others allreduce twice (Sum), then join.
  Checks check;
  if (me != size - 1 || size == 1) {
    for (int k = 0; k < 2; ++k) {
      Tensor t = device_tensor(rank_values(me, 0, 33), DataType::Float32, {33});
      allreduce(t, "join.ar." + std::to_string(k), {.op = ReduceOp::Sum});
      std::vector<double> expected(33, 0.0);
      const int contributors = size == 1 ? 1 : size - 1;
      for (int r = 0; r < contributors; ++r) {
        for (std::int64_t i = 0; i < 33; ++i) expected[static_cast<std::size_t>(i)] += value(r, i);
      }
      check(device_values(t) == expected, "allreduce beside a joined rank");
    }
  }
  const int last = join();
  check(last >= 0 && last < size, "join's answer");
  INFO(check.first);
  CHECK(all_ranks(check.ok));
}

TEST_CASE("CUDA tensors: errors at the call and across ranks", "[cuda][errors]") {
  Session session;
  const Device device = test_device();
  // Within one call: InvalidArgument from the call itself.
  Tensor device_input(DataType::Float32, {4}, device);
  Tensor host_output(DataType::Float32, {4});
  CHECK(error_of([&] { allreduce_async(device_input, host_output, "mixed"); }) ==
        ErrorCode::InvalidArgument);
  CHECK(error_of([&] {
          grouped_allreduce_async({device_input, host_output}, "mixed.group");
        }) == ErrorCode::InvalidArgument);
  CHECK(error_of([&] { allreduce_async(device_input, "adasum", {.op = ReduceOp::Adasum}); }) ==
        ErrorCode::InvalidArgument);
  const int devices = ops::device_ops().device_count();
  TensorView missing(device_input.data(), DataType::Float32, {4}, Device::cuda(devices));
  CHECK(error_of([&] { allreduce_async(missing, "no.such.device"); }) ==
        ErrorCode::InvalidArgument);
  if (devices > 1) {
    // Another device than the one this rank's ops already use.
    Tensor other(DataType::Float32, {4}, Device::cuda((device.index + 1) % devices));
    CHECK(error_of([&] { allreduce_async(other, "second.device"); }) == ErrorCode::InvalidArgument);
  }
  CHECK(all_ranks(true));
  if (world_size() < 2) return;
  // Across ranks: rank 0 submits a CUDA tensor, the others a CPU tensor: Mismatch on every
  // rank, from wait().
  Tensor t =
      world_rank() == 0 ? Tensor(DataType::Float32, {4}, device) : Tensor(DataType::Float32, {4});
  Handle h = allreduce_async(t, "device.mismatch");
  const std::optional<ErrorCode> code = error_of([&] { h.wait(); });
  CHECK(all_ranks(code == ErrorCode::Mismatch));
  // The runtime stays usable.
  Tensor again = device_tensor(rank_values(world_rank(), 0, 4), DataType::Float32, {4});
  allreduce(again, "after.mismatch", {.op = ReduceOp::Sum});
  std::vector<double> expected(4, 0.0);
  for (int r = 0; r < world_size(); ++r) {
    for (std::int64_t i = 0; i < 4; ++i) expected[static_cast<std::size_t>(i)] += value(r, i);
  }
  CHECK(all_ranks(device_values(again) == expected));
}

}  // namespace
}  // namespace tutti::test
