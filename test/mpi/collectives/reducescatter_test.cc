// SPDX-License-Identifier: Apache-2.0
// reducescatter against plain MPI: every numeric dtype, even and uneven dim 0 (API.md's row
// split), Sum and Average, scale factors, grouped and fused batches, and the errors.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

// API.md: rank r receives rows [r·q + min(r, m), ...), q = n / size, m = n % size.
std::vector<double> my_rows(const std::vector<double>& full, std::int64_t n, std::int64_t row) {
  const std::int64_t size = world_size();
  const std::int64_t r = world_rank();
  const std::int64_t q = n / size;
  const std::int64_t m = n % size;
  const std::int64_t first = r * q + std::min(r, m);
  const std::int64_t rows = q + (r < m ? 1 : 0);
  return std::vector<double>(full.begin() + first * row, full.begin() + (first + rows) * row);
}

std::int64_t my_row_count(std::int64_t n) {
  return n / world_size() + (world_rank() < n % world_size() ? 1 : 0);
}

const std::vector<DataType> kNumeric = {
    DataType::UInt8, DataType::Int8,    DataType::UInt16,   DataType::Int16,   DataType::Int32,
    DataType::Int64, DataType::Float16, DataType::BFloat16, DataType::Float32, DataType::Float64};

TEST_CASE("reducescatter matches plain MPI for every dtype, row count, op and scaling",
          "[reducescatter]") {
  Session session;
  Failures failures;
  const std::int64_t size = world_size();
  struct Scaling {
    double prescale, postscale;
  };
  for (DataType dtype : kNumeric) {
    // Even, uneven (the first n % size ranks get an extra row), fewer rows than ranks, none.
    for (std::int64_t n :
         {2 * size, 2 * size + 1, size + size / 2 + 1, std::int64_t{1}, std::int64_t{0}}) {
      for (const Shape& rest : std::vector<Shape>{{}, {3}}) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
          for (Scaling scaling : {Scaling{1.0, 1.0}, Scaling{0.5, 3.0}}) {
            Shape shape = {n};
            shape.insert(shape.end(), rest.begin(), rest.end());
            const std::int64_t row = rest.empty() ? 1 : rest[0];
            HostTensor t(dtype, shape, world_rank(), false);
            const std::vector<double> full =
                mpi_sum(t.values(), dtype, op == ReduceOp::Average, scaling.prescale,
                        scaling.postscale, MPI_COMM_WORLD);
            const Tensor out = reducescatter(t.view(), "rs",
                                             {.op = op,
                                              .prescale_factor = scaling.prescale,
                                              .postscale_factor = scaling.postscale});
            const std::string what = std::string(to_string(dtype)) + " n=" + std::to_string(n) +
                                     " " + std::string(to_string(op)) + " pre " +
                                     std::to_string(scaling.prescale);
            Shape out_shape = shape;
            out_shape[0] = my_row_count(n);
            failures.check(out.shape() == out_shape && out.dtype() == dtype,
                           what + ": output shape");
            failures.expect_equal(compare_values(values_of(out), my_rows(full, n, row), dtype),
                                  what);
          }
        }
      }
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("grouped reducescatter of mixed dtypes scatters each tensor", "[reducescatter]") {
  Session session;
  const std::int64_t size = world_size();
  HostTensor a(DataType::Float32, {2 * size + 1, 2}, world_rank(), false);
  HostTensor b(DataType::Int64, {size + 1}, world_rank() + 3, false);
  HostTensor c(DataType::BFloat16, {3}, world_rank(), false);
  const std::vector<HostTensor*> tensors = {&a, &b, &c};
  std::vector<std::vector<double>> expected;
  for (HostTensor* t : tensors) {
    const std::int64_t n = static_cast<std::int64_t>(t->count()) / (t == &a ? 2 : 1);
    expected.push_back(my_rows(mpi_sum(t->values(), t->dtype(), true, 1.0, 1.0, MPI_COMM_WORLD), n,
                               t == &a ? 2 : 1));
  }
  Handle h = grouped_reducescatter_async({a.view(), b.view(), c.view()}, "group");
  const std::vector<Tensor>& outs = h.outputs();
  Failures failures;
  failures.check(outs.size() == 3, "three outputs");
  for (std::size_t i = 0; i < outs.size() && i < 3; ++i) {
    failures.expect_equal(compare_values(values_of(outs[i]), expected[i], tensors[i]->dtype()),
                          "tensor " + std::to_string(i));
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("a grouped int64 beside float32 is scattered exactly beyond 2^53", "[reducescatter]") {
  // As allreduce_test's: the mixed group once travelled whole as float64.
  Session session;
  constexpr std::int64_t kBig = (std::int64_t{1} << 53) + 1;
  const int size = world_size();
  const int me = world_rank();
  std::vector<std::int64_t> big(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) big[static_cast<std::size_t>(i)] = kBig + me + 2 * i;
  std::vector<float> small(static_cast<std::size_t>(size), 1.0f);
  std::vector<std::int64_t> sum(big.size());
  MPI_Allreduce(big.data(), sum.data(), size, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  Handle h = grouped_reducescatter_async(
      {TensorView(small.data(), {size}), TensorView(big.data(), {size})}, "int64.exact",
      {.op = ReduceOp::Sum});                     // Average would compute in double (API.md).
  const std::vector<Tensor>& outs = h.outputs();  // One row of each per rank.
  const bool ok = outs.size() == 2 && outs[1].num_elements() == 1 &&
                  outs[1].span<std::int64_t>()[0] == sum[static_cast<std::size_t>(me)] &&
                  outs[0].num_elements() == 1 &&
                  outs[0].span<float>()[0] == static_cast<float>(size);
  CHECK(all_ranks(ok));
}

TEST_CASE("many async reducescatters in rank-dependent order fuse and stay correct",
          "[reducescatter]") {
  Session session;
  constexpr int kCount = 50;
  const std::int64_t size = world_size();
  std::vector<HostTensor> tensors;
  std::vector<std::vector<double>> expected;
  for (int i = 0; i < kCount; ++i) {
    const DataType dtype = i % 3 == 0   ? DataType::Float32
                           : i % 3 == 1 ? DataType::Int32
                                        : DataType::Float16;
    const std::int64_t n = size * (i % 4) + i % 3;
    tensors.emplace_back(dtype, Shape{n, 1 + i % 4}, world_rank() + i, false);
    expected.push_back(my_rows(
        mpi_sum(tensors.back().values(), dtype, false, 1.0, 1.0, MPI_COMM_WORLD), n, 1 + i % 4));
  }
  std::vector<int> order(kCount);
  for (int i = 0; i < kCount; ++i) order[static_cast<std::size_t>(i)] = i;
  std::mt19937 shuffle(static_cast<unsigned>(7 + world_rank()));
  std::shuffle(order.begin(), order.end(), shuffle);
  std::vector<Handle> handles(kCount);
  for (int i : order) {
    handles[static_cast<std::size_t>(i)] =
        reducescatter_async(tensors[static_cast<std::size_t>(i)].view(),
                            "many." + std::to_string(i), {.op = ReduceOp::Sum});
  }
  Failures failures;
  for (std::size_t i = 0; i < kCount; ++i) {
    failures.expect_equal(
        compare_values(values_of(handles[i].output()), expected[i], tensors[i].dtype()),
        "many." + std::to_string(i));
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE(
    "reducescatter errors: ops other than Sum/Average, 0-d and bool at the call; shape mismatch",
    "[reducescatter][errors]") {
  Session session;
  std::vector<float> v(8);
  std::vector<std::uint8_t> flags(8);
  float scalar = 0;
  std::string message;
  for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max, ReduceOp::Product, ReduceOp::Adasum}) {
    CHECK(error_of([&] { reducescatter_async(TensorView(v.data(), {8}), "op", {.op = op}); },
                   &message) == ErrorCode::InvalidArgument);
  }
  CHECK(message.find("REDUCESCATTER 'op'") != std::string::npos);
  CHECK(error_of([&] { reducescatter_async(TensorView(&scalar, {}), "scalar"); }) ==
        ErrorCode::InvalidArgument);
  // No op reduce-scatters bool; the message says so (before, it advised MIN or MAX, which
  // reducescatter refuses too).
  CHECK(
      error_of([&] { reducescatter_async(TensorView(flags.data(), DataType::Bool, {8}), "bool"); },
               &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("bool tensors cannot be reduce-scattered") != std::string::npos);
  CHECK(error_of([&] { grouped_reducescatter_async({}, "none"); }) == ErrorCode::InvalidArgument);
  if (world_size() < 2) return;
  const bool odd = world_rank() == world_size() - 1;
  auto shape =
      error_of([&] { reducescatter(TensorView(v.data(), {odd ? 8 : 4}), "shape"); }, &message);
  CHECK(all_ranks(
      shape == ErrorCode::Mismatch && message.find("REDUCESCATTER") != std::string::npos &&
      message.find("[4]") != std::string::npos && message.find("[8]") != std::string::npos));
  auto scale = error_of(
      [&] {
        reducescatter(TensorView(v.data(), {4}), "scale", {.postscale_factor = odd ? 2.0 : 1.0});
      },
      &message);
  CHECK(all_ranks(scale == ErrorCode::Mismatch && message.find("postscale") != std::string::npos));
}

}  // namespace
}  // namespace tutti::test
