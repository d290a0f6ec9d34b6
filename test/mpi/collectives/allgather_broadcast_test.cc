// SPDX-License-Identifier: Apache-2.0
// allgather and broadcast against plain MPI: every dtype x shape, rank-dependent dim 0 (0 rows
// included), grouped and fused batches, every root, the object helpers, and the cross-rank
// errors (dim-1 and dtype mismatch, root mismatch).
#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

// Dim 0 of this rank's input in each row-count pattern: equal, rank-dependent, 0 on even ranks.
std::int64_t rows_for(int pattern, int rank) {
  switch (pattern) {
    case 0: return 3;
    case 1: return rank + 1;
    default: return rank % 2 == 0 ? 0 : 2;
  }
}

const std::vector<Shape> kRest = {{}, {3}, {0, 2}, {2, 2}};

Shape make_shape(std::int64_t rows, const Shape& rest) {
  Shape shape = {rows};
  shape.insert(shape.end(), rest.begin(), rest.end());
  return shape;
}

TEST_CASE("allgather matches plain MPI for every dtype, shape and row pattern", "[allgather]") {
  Session session;
  Failures failures;
  std::int64_t total_rows[3] = {0, 0, 0};
  for (int pattern = 0; pattern < 3; ++pattern) {
    for (int r = 0; r < world_size(); ++r) total_rows[pattern] += rows_for(pattern, r);
  }
  for (DataType dtype : kAllDtypes) {
    for (int pattern = 0; pattern < 3; ++pattern) {
      for (const Shape& rest : kRest) {
        HostTensor t(dtype, make_shape(rows_for(pattern, world_rank()), rest), world_rank(), false);
        const std::vector<double> expected = mpi_allgatherv(t.values(), MPI_COMM_WORLD);
        const Tensor out = allgather(t.view(), "ag");
        const std::string what = std::string(to_string(dtype)) + " pattern " +
                                 std::to_string(pattern) + " rest " + std::to_string(rest.size()) +
                                 "-d";
        failures.check(out.shape() == make_shape(total_rows[pattern], rest) && out.dtype() == dtype,
                       what + ": output shape or dtype");
        failures.expect_equal(compare_values(values_of(out), expected, dtype), what);
      }
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("grouped allgather of mixed dtypes gathers each tensor", "[allgather]") {
  Session session;
  const int rank = world_rank();
  HostTensor a(DataType::Float32, {rank + 1, 2}, rank, false);
  HostTensor b(DataType::Int64, {rank % 2 == 0 ? 0 : 3}, rank + 5, false);
  HostTensor c(DataType::Bool, {2, 1, 3}, rank, false);
  HostTensor d(DataType::Float16, {1}, rank, false);
  std::vector<std::vector<double>> expected;
  for (HostTensor* t : {&a, &b, &c, &d})
    expected.push_back(mpi_allgatherv(t->values(), MPI_COMM_WORLD));
  Handle h = grouped_allgather_async({a.view(), b.view(), c.view(), d.view()}, "group");
  const std::vector<Tensor>& outs = h.outputs();
  Failures failures;
  failures.check(outs.size() == 4, "four outputs");
  if (outs.size() == 4) {
    const DataType dtypes[] = {DataType::Float32, DataType::Int64, DataType::Bool,
                               DataType::Float16};
    for (std::size_t i = 0; i < 4; ++i) {
      failures.expect_equal(compare_values(values_of(outs[i]), expected[i], dtypes[i]),
                            "tensor " + std::to_string(i));
    }
    failures.check(h.output().data() == outs[0].data(), "output() is the first");
    failures.check(outs[2].shape() == Shape({2 * world_size(), 1, 3}), "bool shape");
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("many async allgathers in rank-dependent order fuse and stay correct", "[allgather]") {
  Session session;
  constexpr int kCount = 60;
  std::vector<HostTensor> tensors;
  std::vector<std::vector<double>> expected;
  for (int i = 0; i < kCount; ++i) {
    const DataType dtype = i % 3 == 0   ? DataType::Float32
                           : i % 3 == 1 ? DataType::Int32
                                        : DataType::UInt8;
    const std::int64_t rows = (i + world_rank()) % 4;  // Some ranks send 0 rows.
    tensors.emplace_back(dtype, Shape{rows, 1 + i % 5}, world_rank() + i, false);
    expected.push_back(mpi_allgatherv(tensors.back().values(), MPI_COMM_WORLD));
  }
  std::vector<int> order(kCount);
  for (int i = 0; i < kCount; ++i) order[static_cast<std::size_t>(i)] = i;
  std::mt19937 shuffle(static_cast<unsigned>(99 + world_rank()));
  std::shuffle(order.begin(), order.end(), shuffle);
  std::vector<Handle> handles(kCount);
  for (int i : order)
    handles[static_cast<std::size_t>(i)] =
        allgather_async(tensors[static_cast<std::size_t>(i)].view(), "many." + std::to_string(i));
  Failures failures;
  for (int i = 0; i < kCount; ++i) {
    const auto& t = tensors[static_cast<std::size_t>(i)];
    failures.expect_equal(compare_values(values_of(handles[static_cast<std::size_t>(i)].output()),
                                         expected[static_cast<std::size_t>(i)], t.dtype()),
                          "many." + std::to_string(i));
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("allgather errors: 0-d at the call, dim-1 and dtype mismatch on every rank",
          "[allgather][errors]") {
  Session session;
  float scalar = 1;
  CHECK(error_of([&] { allgather_async(TensorView(&scalar, {}), "scalar"); }) ==
        ErrorCode::InvalidArgument);
  CHECK(error_of([&] { grouped_allgather_async({}, "none"); }) == ErrorCode::InvalidArgument);
  if (world_size() < 2) return;
  {
    // A name in flight in the set is refused for any op; after the op it is free again. The
    // op is held in flight by its peers: each rank in turn submits "busy" alone and checks,
    // and the others submit only after a plain MPI barrier. (With every rank submitting at
    // once, the allreduce could complete before the checks, and a broadcast then accepted
    // stayed pending and made the next allgather("busy") fail.)
    std::vector<float> busy(2, 1.0f);
    bool refused = true;
    for (int holder = 0; holder < world_size(); ++holder) {
      Handle first;
      if (world_rank() == holder) {
        first = allreduce_async(TensorView(busy.data(), {2}), "busy");
        std::string message;
        refused = refused &&
                  error_of([&] { allgather_async(TensorView(busy.data(), {2}), "busy"); },
                           &message) == ErrorCode::InvalidArgument &&
                  message.find("'busy'") != std::string::npos &&
                  error_of([&] { broadcast_async(TensorView(busy.data(), {2}), 0, "busy"); }) ==
                      ErrorCode::InvalidArgument;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (world_rank() != holder) first = allreduce_async(TensorView(busy.data(), {2}), "busy");
      first.wait();
    }
    CHECK(all_ranks(refused));
    CHECK(all_ranks(allgather(TensorView(busy.data(), {2}), "busy").num_elements() ==
                    2 * world_size()));
    barrier();
  }
  if (world_size() < 2) return;
  const bool odd = world_rank() == world_size() - 1;
  std::vector<float> f(12);
  std::vector<std::int32_t> ints(12);
  std::string message;
  auto dims = error_of(
      [&] {
        allgather(TensorView(f.data(), {2, odd ? 6 : 3}), "dims");
      },
      &message);
  CHECK(all_ranks(dims == ErrorCode::Mismatch && message.find("ALLGATHER") != std::string::npos &&
                  message.find("[2, 3]") != std::string::npos &&
                  message.find("[2, 6]") != std::string::npos));
  auto dtype = error_of(
      [&] {
        if (odd)
          allgather(TensorView(ints.data(), {3}), "dtype");
        else
          allgather(TensorView(f.data(), {3}), "dtype");
      },
      &message);
  CHECK(all_ranks(dtype == ErrorCode::Mismatch && message.find("int32") != std::string::npos));
  // Still usable afterwards.
  const Tensor out = allgather(TensorView(f.data(), {1}), "after");
  CHECK(all_ranks(out.num_elements() == world_size()));
}

TEST_CASE("an allgather or gather whose rows add up past int64 fails on every rank",
          "[allgather][errors]") {
  if (world_size() < 2) return;
  Session session;
  // Each rank's tensor is valid alone (rows of zero width hold no memory); the sum of the
  // ranks' rows is not a dim 0. Before, the communication thread made a tensor of negative
  // shape and stopped the runtime.
  const std::int64_t rows = std::numeric_limits<std::int64_t>::max() / 2 + 1;
  const TensorView wide(nullptr, DataType::Float32, {rows, 0});
  std::string message;
  const auto all = error_of([&] { allgather(wide, "rows.all"); }, &message);
  CHECK(all_ranks(all == ErrorCode::InvalidArgument &&
                  message.find("ALLGATHER 'rows.all': each rank's output would have") !=
                      std::string::npos &&
                  message.find(" rows of [0] float32") != std::string::npos));
  const auto rooted = error_of([&] { gather(wide, 1, "rows.rooted"); }, &message);
  CHECK(all_ranks(rooted == ErrorCode::InvalidArgument &&
                  message.find("the root's (rank 1) output") != std::string::npos));
  std::vector<float> f(1, 1.0f);
  CHECK(
      all_ranks(allgather(TensorView(f.data(), {1}), "rows.after").num_elements() == world_size()));
}

TEST_CASE("broadcast from every root for every dtype and shape", "[broadcast]") {
  Session session;
  Failures failures;
  for (int root = 0; root < world_size(); ++root) {
    for (DataType dtype : kAllDtypes) {
      for (const Shape& shape : std::vector<Shape>{{}, {0}, {5}, {3, 4}, {1025}}) {
        HostTensor t(dtype, shape, world_rank(), false);
        const HostTensor root_data(dtype, shape, root,
                                   false);  // The closed form: the root's input.
        broadcast(t.view(), root, "bcast");
        failures.expect_equal(t.compare(root_data.values()),
                              std::string(to_string(dtype)) + " root " + std::to_string(root));
      }
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("broadcast errors: root outside, root and shape mismatch", "[broadcast][errors]") {
  Session session;
  std::vector<float> v(8);
  CHECK(error_of([&] { broadcast_async(TensorView(v.data(), {4}), -1, "neg"); }) ==
        ErrorCode::InvalidArgument);
  if (world_size() < 2) return;
  const bool odd = world_rank() == world_size() - 1;
  std::string message;
  auto root =
      error_of([&] { broadcast(TensorView(v.data(), {4}), odd ? 1 : 0, "root"); }, &message);
  CHECK(all_ranks(root == ErrorCode::Mismatch && message.find("root ranks") != std::string::npos));
  auto shape =
      error_of([&] { broadcast(TensorView(v.data(), {odd ? 8 : 4}), 0, "shape"); }, &message);
  CHECK(all_ranks(shape == ErrorCode::Mismatch && message.find("[4]") != std::string::npos &&
                  message.find("[8]") != std::string::npos));
}

TEST_CASE("broadcast_object and allgather_object carry bytes of any length",
          "[broadcast][allgather]") {
  Session session;
  const std::string mine(static_cast<std::size_t>(world_rank() * 3),
                         static_cast<char>('a' + world_rank()));
  Failures failures;
  for (int root = 0; root < world_size(); ++root) {
    const std::string got = broadcast_object(mine, root, "obj");
    failures.check(
        got == std::string(static_cast<std::size_t>(root * 3), static_cast<char>('a' + root)),
        "broadcast_object from " + std::to_string(root));
  }
  const std::vector<std::string> all = allgather_object(mine, "objs");
  failures.check(all.size() == static_cast<std::size_t>(world_size()), "allgather_object count");
  for (std::size_t r = 0; r < all.size(); ++r) {
    failures.check(all[r] == std::string(r * 3, static_cast<char>('a' + r)),
                   "allgather_object " + std::to_string(r));
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

}  // namespace
}  // namespace tutti::test
