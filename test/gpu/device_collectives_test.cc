// SPDX-License-Identifier: Apache-2.0
// The public collectives over CUDA tensors (API.md, "Tensors with Device::cuda(i)"), at 1-4
// ranks that may share one GPU (then core runs MPI through host staging): allreduce with every
// op and scale factors, grouped allreduce of mixed dtypes, allgather, broadcast, alltoall,
// reducescatter, and the CPU/CUDA mismatch errors. Expected values are closed forms.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <cuda_runtime.h>
#include <mpi.h>

#include "test/gpu/gpu_test_util.h"
#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {

int devices_needed(int /*local_size*/) { return 1; }  // Ranks may share one GPU.

namespace {

struct Session {
  Session() { tutti::init(); }
  ~Session() { tutti::shutdown(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

Device my_device() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  return Device::cuda(device);
}

Tensor cuda_tensor(const std::vector<double>& values, DataType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape), my_device());
  upload(t.data(), encode(values, dtype));
  return t;
}

std::vector<double> values_of(const TensorView& t) {
  REQUIRE(t.device() == my_device());
  return decode(download(t.data(), t.byte_size()), t.dtype());
}

// Rank r's element i: small integers, so float16 sums stay exact.
double value(int rank, std::int64_t i) { return static_cast<double>((i + 2 * rank) % 5); }

std::vector<double> rank_values(int rank, std::int64_t first, std::int64_t count) {
  std::vector<double> out;
  for (std::int64_t i = 0; i < count; ++i) out.push_back(value(rank, first + i));
  return out;
}

template <class F>
std::optional<ErrorCode> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return std::nullopt;
}

TEST_CASE("allreduce of CUDA tensors: every op, scale factors, float16 and integers",
          "[cuda][allreduce]") {
  Session session;
  const int size = world_size();
  const int me = world_rank();
  bool ok = true;
  std::string first;
  struct Case {
    DataType dtype;
    ReduceOp op;
    double prescale, postscale;
  };
  const Case cases[] = {{DataType::Float32, ReduceOp::Average, 1.0, 1.0},
                        {DataType::Float32, ReduceOp::Sum, 0.5, 3.0},
                        {DataType::Float16, ReduceOp::Average, 1.0, 1.0},
                        {DataType::BFloat16, ReduceOp::Sum, 1.0, 1.0},
                        {DataType::Float64, ReduceOp::Min, 1.0, 1.0},
                        {DataType::Int32, ReduceOp::Max, 1.0, 1.0},
                        {DataType::Int32, ReduceOp::Average, 1.0, 1.0},
                        {DataType::Int64, ReduceOp::Sum, 1.0, 1.0},
                        {DataType::UInt8, ReduceOp::Product, 1.0, 1.0},
                        {DataType::Int16, ReduceOp::Sum, 2.0, 1.0}};
  for (const Case& c : cases) {
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1027}}) {
      Tensor t = cuda_tensor(rank_values(me, 0, n), c.dtype, {n});
      allreduce(t, "ar",
                {.op = c.op, .prescale_factor = c.prescale, .postscale_factor = c.postscale});
      const std::vector<double> got = values_of(t);
      for (std::int64_t i = 0; i < n; ++i) {
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
        const double tolerance = is_floating(c.dtype) ? 1e-2 * std::max(1.0, expected) : 0.0;
        if (std::abs(got[static_cast<std::size_t>(i)] - expected) > tolerance && ok) {
          ok = false;
          first = std::string(to_string(c.dtype)) + " op " +
                  std::to_string(static_cast<int>(c.op)) + " element " + std::to_string(i);
        }
      }
    }
  }
  INFO(first);
  CHECK(all_ranks(ok));
}

TEST_CASE("grouped allreduce of mixed-dtype CUDA tensors", "[cuda][allreduce]") {
  Session session;
  const int size = world_size();
  std::vector<Tensor> tensors = {
      cuda_tensor(rank_values(world_rank(), 0, 5), DataType::Float32, {5}),
      cuda_tensor(rank_values(world_rank(), 0, 300), DataType::Float16, {300}),
      cuda_tensor(rank_values(world_rank(), 0, 17), DataType::Int64, {17})};
  grouped_allreduce({tensors[0], tensors[1], tensors[2]}, "group", {.op = ReduceOp::Sum});
  bool ok = true;
  for (const Tensor& t : tensors) {
    const std::vector<double> got = values_of(t);
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
  bool ok = true;
  std::string first;
  auto check = [&](bool good, const std::string& what) {
    if (!good && ok) first = what;
    ok = ok && good;
  };

  // allgather: rank r contributes r + 1 rows of 3.
  const Tensor gathered = allgather(
      cuda_tensor(rank_values(me, 0, 3 * (me + 1)), DataType::Float32, {me + 1, 3}), "ag");
  std::vector<double> expected;
  for (int r = 0; r < size; ++r) {
    const std::vector<double> part = rank_values(r, 0, 3 * (r + 1));
    expected.insert(expected.end(), part.begin(), part.end());
  }
  check(gathered.device() == my_device() && values_of(gathered) == expected, "allgather");

  // broadcast from the last rank.
  Tensor b = cuda_tensor(rank_values(me, 0, 999), DataType::Int32, {999});
  broadcast(b, size - 1, "bc");
  check(values_of(b) == rank_values(size - 1, 0, 999), "broadcast");

  // alltoall: equal splits of 2 rows per rank; rows tagged by sender.
  std::vector<double> rows;
  for (int d = 0; d < size; ++d)
    rows.insert(rows.end(), {double(me * 10 + d), double(me * 10 + d)});
  const AlltoallResult a2a = alltoall(cuda_tensor(rows, DataType::Float64, {2 * size}), {}, "a2a");
  std::vector<double> received;
  for (int s = 0; s < size; ++s)
    received.insert(received.end(), {double(s * 10 + me), double(s * 10 + me)});
  check(values_of(a2a.output) == received, "alltoall");
  check(a2a.received_splits == std::vector<std::int64_t>(static_cast<std::size_t>(size), 2),
        "alltoall splits");

  // reducescatter: 2 * size + 1 rows, split as API.md says.
  const std::int64_t n = 2 * size + 1;
  const Tensor scattered = reducescatter(cuda_tensor(rank_values(me, 0, n), DataType::Float32, {n}),
                                         "rs", {.op = ReduceOp::Sum});
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
  check(values_of(scattered) == sums, "reducescatter");
  INFO(first);
  CHECK(all_ranks(ok));
}

TEST_CASE("CPU and CUDA tensors do not mix", "[cuda][errors]") {
  Session session;
  // Within one call: InvalidArgument from the call itself.
  Tensor device_input(DataType::Float32, {4}, my_device());
  Tensor host_output(DataType::Float32, {4});
  CHECK(error_of([&] { allreduce_async(device_input, host_output, "mixed"); }) ==
        ErrorCode::InvalidArgument);
  CHECK(all_ranks(true));
  if (world_size() < 2) return;
  // Across ranks: rank 0 submits a CUDA tensor, the others a CPU tensor: Mismatch on every
  // rank, from wait().
  Tensor t = world_rank() == 0 ? Tensor(DataType::Float32, {4}, my_device())
                               : Tensor(DataType::Float32, {4});
  Handle h = allreduce_async(t, "device.mismatch");
  const std::optional<ErrorCode> code = error_of([&] { h.wait(); });
  CHECK(all_ranks(code == ErrorCode::Mismatch));
  // The runtime stays usable.
  Tensor again(DataType::Float32, {4}, my_device());
  allreduce(again, "after.mismatch");
  CHECK(all_ranks(true));
}

}  // namespace
}  // namespace tutti::test
