// SPDX-License-Identifier: Apache-2.0
// Adasum against its closed form: orthogonal vectors add, equal vectors stay, and in general
// adasum(v_0..v_{n-1}) = combine(adasum(first half), adasum(second half)) with
// combine(a, b) = (1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b, per tensor. Every rank knows every
// rank's input (a function of the rank), so the expected result is computed locally.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

using Vector = std::vector<double>;

Vector combine(const Vector& a, const Vector& b) {
  double dot = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double ca = aa >= 1e-8 ? 1 - dot / (2 * aa) : 1;
  const double cb = bb >= 1e-8 ? 1 - dot / (2 * bb) : 1;
  Vector out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

Vector closed_form(const std::vector<Vector>& inputs, std::size_t begin, std::size_t end) {
  if (end - begin == 1) return inputs[begin];
  const std::size_t middle = begin + (end - begin) / 2;
  return combine(closed_form(inputs, begin, middle), closed_form(inputs, middle, end));
}

bool power_of_two(int n) { return (n & (n - 1)) == 0; }

// Rank r's input of `count` elements: small values with rank-dependent directions.
Vector input_of(int rank, std::size_t count, int salt) {
  Vector v(count);
  for (std::size_t i = 0; i < count; ++i) {
    v[i] = static_cast<double>((static_cast<int>(i) * 7 + rank * 3 + salt) % 11) / 4.0 - 1.0;
  }
  return v;
}

HostTensor tensor_of(DataType dtype, const Vector& values) {
  HostTensor t(dtype, {static_cast<std::int64_t>(values.size())}, 0, false);
  auto* p = static_cast<std::byte*>(t.view().data());
  for (std::size_t i = 0; i < values.size(); ++i)
    store(p + i * element_size(dtype), dtype, values[i]);
  return t;
}

TEST_CASE("Adasum of orthogonal vectors is their sum, of equal vectors the vector", "[adasum]") {
  if (!power_of_two(world_size())) return;
  Session session;
  const int size = world_size();
  Failures failures;
  for (DataType dtype :
       {DataType::Float32, DataType::Float64, DataType::Float16, DataType::BFloat16}) {
    Vector one_hot(static_cast<std::size_t>(size), 0.0);
    one_hot[static_cast<std::size_t>(world_rank())] = 2.0;
    HostTensor orthogonal = tensor_of(dtype, one_hot);
    allreduce(orthogonal.view(), "orthogonal", {.op = ReduceOp::Adasum});
    failures.expect_equal(orthogonal.compare(Vector(static_cast<std::size_t>(size), 2.0)),
                          std::string(to_string(dtype)) + " orthogonal");
    const Vector same = input_of(0, 37, 1);
    HostTensor equal = tensor_of(dtype, same);
    const std::vector<double> expected = equal.values();  // The vector as stored in this dtype.
    allreduce(equal.view(), "equal", {.op = ReduceOp::Adasum});
    failures.expect_equal(equal.compare(expected), std::string(to_string(dtype)) + " equal");
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("Adasum matches the recursive closed form for every floating dtype and length",
          "[adasum]") {
  if (!power_of_two(world_size())) return;
  Session session;
  const int size = world_size();
  Failures failures;
  for (DataType dtype :
       {DataType::Float32, DataType::Float64, DataType::Float16, DataType::BFloat16}) {
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{64}, std::size_t{1001}}) {
      std::vector<Vector> inputs;
      for (int r = 0; r < size; ++r)
        inputs.push_back(tensor_of(dtype, input_of(r, count, 0)).values());
      HostTensor t = tensor_of(dtype, inputs[static_cast<std::size_t>(world_rank())]);
      allreduce(t.view(), "general", {.op = ReduceOp::Adasum});
      const Vector expected = closed_form(inputs, 0, inputs.size());
      failures.expect_equal(compare_values(t.values(), expected, dtype),
                            std::string(to_string(dtype)) + " count " + std::to_string(count));
      // The inputs are not orthogonal: a plain sum would not pass.
      Vector sum(count, 0.0);
      for (const Vector& v : inputs) {
        for (std::size_t i = 0; i < count; ++i) sum[i] += v[i];
      }
      failures.check(size == 1 || count < 64 || !compare_values(sum, expected, dtype).empty(),
                     "inputs too easy");
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("grouped Adasum combines each tensor with its own coefficients; scale factors apply",
          "[adasum]") {
  if (!power_of_two(world_size())) return;
  Session session;
  const int size = world_size();
  std::vector<Vector> first, second;
  for (int r = 0; r < size; ++r) {
    first.push_back(input_of(r, 10, 2));
    second.push_back(input_of(r * r + 1, 7, 5));
  }
  HostTensor a = tensor_of(DataType::Float64, first[static_cast<std::size_t>(world_rank())]);
  HostTensor b = tensor_of(DataType::Float32, second[static_cast<std::size_t>(world_rank())]);
  grouped_allreduce({a.view(), b.view()}, "group", {.op = ReduceOp::Adasum});
  Failures failures;
  failures.expect_equal(
      compare_values(a.values(), closed_form(first, 0, first.size()), DataType::Float64), "first");
  failures.expect_equal(
      compare_values(b.values(), closed_form(second, 0, second.size()), DataType::Float32),
      "second");
  // Prescale scales every input (Adasum is scale-equivariant), postscale the result.
  HostTensor c = tensor_of(DataType::Float64, first[static_cast<std::size_t>(world_rank())]);
  allreduce(c.view(), "scaled",
            {.op = ReduceOp::Adasum, .prescale_factor = 2.0, .postscale_factor = 0.25});
  Vector expected = closed_form(first, 0, first.size());
  for (double& x : expected) x *= 0.5;
  failures.expect_equal(compare_values(c.values(), expected, DataType::Float64), "scaled");
  // Into a separate output (combined there, in place): the input stays as it was.
  const Vector mine = first[static_cast<std::size_t>(world_rank())];
  HostTensor in = tensor_of(DataType::Float64, mine);
  HostTensor out = tensor_of(DataType::Float64, Vector(mine.size(), 0.0));
  allreduce_async(in.view(), out.view(), "out of place",
                  {.op = ReduceOp::Adasum, .prescale_factor = 2.0})
      .wait();
  Vector doubled = closed_form(first, 0, first.size());
  for (double& x : doubled) x *= 2.0;
  failures.expect_equal(compare_values(out.values(), doubled, DataType::Float64), "output");
  failures.expect_equal(compare_values(in.values(), mine, DataType::Float64), "input kept");
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("Adasum errors: integer tensors, and a set size that is not a power of two",
          "[adasum][errors]") {
  Session session;
  std::vector<std::int32_t> ints(4);
  std::vector<float> floats(4);
  std::string message;
  CHECK(error_of([&] {
          allreduce_async(TensorView(ints.data(), {4}), "ints", {.op = ReduceOp::Adasum});
        }) == ErrorCode::InvalidArgument);
  if (!power_of_two(world_size())) {
    CHECK(all_ranks(error_of(
                        [&] {
                          allreduce_async(TensorView(floats.data(), {4}), "odd",
                                          {.op = ReduceOp::Adasum});
                        },
                        &message) == ErrorCode::InvalidArgument &&
                    message.find("power-of-two") != std::string::npos));
  }
  if (world_size() >= 4) {
    // A set of three ranks in a job of four.
    ProcessSet three = add_process_set({0, 1, 2});
    CHECK(all_ranks(!three.included() || error_of([&] {
                                           allreduce_async(
                                               TensorView(floats.data(), {4}), "three",
                                               {.op = ReduceOp::Adasum, .process_set = three});
                                         }) == ErrorCode::InvalidArgument));
  }
}

}  // namespace
}  // namespace tutti::test
