// SPDX-License-Identifier: Apache-2.0
// Process sets: add/remove and their errors, ids equal on every rank, every op on the even
// and odd sets against plain MPI over the same ranks, concurrent ops on overlapping sets, ops
// on a foreign or removed set, and ops in flight on a removed set.
#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

std::vector<int> ranks_with_parity(int parity) {
  std::vector<int> ranks;
  for (int r = parity; r < world_size(); r += 2) ranks.push_back(r);
  return ranks;
}

// True on every rank iff `value` is the same on every rank.
bool same_everywhere(int value) {
  int low = value, high = value;
  MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return low == high;
}

TEST_CASE("add_process_set numbers sets from 1 alike on every rank; accessors", "[process_set]") {
  Session session;
  if (world_size() == 1) {
    // The only possible set equals the global one.
    CHECK(error_of([] { add_process_set({0}); }) == ErrorCode::InvalidArgument);
    return;
  }
  ProcessSet even = add_process_set(ranks_with_parity(0));
  ProcessSet odd = add_process_set(ranks_with_parity(1));
  std::vector<int> reversed = {1, 0};  // Given in any order; ranks() is sorted.
  ProcessSet pair = world_size() > 2 ? add_process_set(reversed) : ProcessSet(0);
  const bool in_even = world_rank() % 2 == 0;
  CHECK(all_ranks(even.id() == 1 && odd.id() == 2 && same_everywhere(pair.id())));
  CHECK(all_ranks(even.ranks() == ranks_with_parity(0) && odd.ranks() == ranks_with_parity(1)));
  CHECK(all_ranks(even.included() == in_even && odd.included() == !in_even));
  const ProcessSet& mine = in_even ? even : odd;
  CHECK(all_ranks(mine.rank() == world_rank() / 2 &&
                  mine.size() == static_cast<int>(mine.ranks().size())));
  CHECK(all_ranks(error_of([&] { static_cast<void>((in_even ? odd : even).rank()); }) ==
                  ErrorCode::InvalidArgument));
  if (world_size() > 2) CHECK(all_ranks(pair.ranks() == std::vector<int>({0, 1})));
  remove_process_set(odd);
  CHECK(all_ranks(error_of([&] { static_cast<void>(odd.size()); }) == ErrorCode::InvalidArgument));
  // Ids are never reused within a session.
  ProcessSet again = add_process_set(ranks_with_parity(1));
  CHECK(
      all_ranks(again.id() == (world_size() > 2 ? 4 : 3) && again.ranks() == ranks_with_parity(1)));
}

TEST_CASE("add_process_set and remove_process_set errors, on every rank", "[process_set][errors]") {
  Session session;
  const int size = world_size();
  std::string message;
  CHECK(all_ranks(error_of([] { add_process_set({}); }) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(error_of(
                      [&] {
                        add_process_set({0, size});
                      },
                      &message) == ErrorCode::InvalidArgument &&
                  message.find(std::to_string(size)) != std::string::npos));
  CHECK(all_ranks(error_of([] { add_process_set({-1}); }) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(error_of(
                      [] {
                        add_process_set({0, 0});
                      },
                      &message) == ErrorCode::InvalidArgument &&
                  message.find("repeated") != std::string::npos));
  // The global set's ranks, in any order.
  std::vector<int> all(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) all[static_cast<std::size_t>(r)] = size - 1 - r;
  CHECK(all_ranks(error_of([&] { add_process_set(all); }) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(error_of([] { remove_process_set(ProcessSet::global()); }) ==
                  ErrorCode::InvalidArgument));
  CHECK(all_ranks(error_of([] { remove_process_set(ProcessSet(77)); }) ==
                  ErrorCode::InvalidArgument));
  if (size > 1) {
    ProcessSet first = add_process_set({0});
    CHECK(
        all_ranks(error_of([] { add_process_set({0}); }, &message) == ErrorCode::InvalidArgument &&
                  message.find("process set " + std::to_string(first.id())) != std::string::npos));
    // An op on a set without this rank, and on a removed set, is refused by the call.
    std::vector<float> v(2);
    CHECK(all_ranks(world_rank() == 0 || error_of([&] {
                                           allreduce_async(TensorView(v.data(), {2}), "x",
                                                           {.process_set = first});
                                         }) == ErrorCode::InvalidArgument));
    remove_process_set(first);
    CHECK(all_ranks(error_of([&] {
                      allreduce_async(TensorView(v.data(), {2}), "x", {.process_set = first});
                    }) == ErrorCode::InvalidArgument));
    CHECK(all_ranks(error_of([&] { remove_process_set(first); }) == ErrorCode::InvalidArgument));
  }
  // The runtime is usable after all of that.
  std::vector<float> v(3, 1.0f);
  allreduce(TensorView(v.data(), {3}), "after", {.op = ReduceOp::Sum});
  CHECK(all_ranks(v[2] == static_cast<float>(size)));
}

TEST_CASE("every op on the even and odd sets matches plain MPI over the same ranks",
          "[process_set]") {
  Session session;
  if (world_size() == 1) return;
  const int parity = world_rank() % 2;
  ProcessSet even = add_process_set(ranks_with_parity(0));
  ProcessSet odd = add_process_set(ranks_with_parity(1));
  const ProcessSet set = parity == 0 ? even : odd;
  SubComm oracle(parity);
  const int set_size = set.size();
  const int set_rank = set.rank();
  Failures failures;
  // Allreduce, Sum and Average.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
    HostTensor t(DataType::Float32, {17}, world_rank(), false);
    const auto expected =
        mpi_sum(t.values(), DataType::Float32, op == ReduceOp::Average, 1, 1, oracle.comm);
    allreduce(t.view(), "ar", {.op = op, .process_set = set});
    failures.expect_equal(t.compare(expected), "allreduce");
  }
  // Allgather with a rank-dependent row count.
  HostTensor g(DataType::Int32, {world_rank() + 1, 2}, world_rank(), false);
  failures.expect_equal(compare_values(values_of(allgather(g.view(), "ag", set)),
                                       mpi_allgatherv(g.values(), oracle.comm), DataType::Int32),
                        "allgather");
  // Broadcast from every member.
  for (int root : set.ranks()) {
    HostTensor b(DataType::Float64, {4}, world_rank(), false);
    broadcast(b.view(), root, "bc", set);
    failures.expect_equal(b.compare(HostTensor(DataType::Float64, {4}, root, false).values()),
                          "broadcast");
  }
  // Alltoall with equal splits: row i of each member goes to set rank i.
  std::vector<std::int64_t> rows(static_cast<std::size_t>(set_size));
  for (int i = 0; i < set_size; ++i) rows[static_cast<std::size_t>(i)] = world_rank() * 100 + i;
  const AlltoallResult a2a = alltoall(TensorView(rows.data(), {set_size}), {}, "a2a", set);
  const std::vector<int>& members = set.ranks();
  for (int i = 0; i < set_size; ++i) {
    failures.check(a2a.output.span<std::int64_t>()[static_cast<std::size_t>(i)] ==
                       members[static_cast<std::size_t>(i)] * 100 + set_rank,
                   "alltoall");
  }
  // Reducescatter, uneven.
  HostTensor rs(DataType::Float32, {2 * set_size + 1}, world_rank(), false);
  const auto full = mpi_sum(rs.values(), DataType::Float32, false, 1, 1, oracle.comm);
  const Tensor rs_out = reducescatter(rs.view(), "rs", {.op = ReduceOp::Sum, .process_set = set});
  const std::int64_t q = 2, m = 1;
  const std::int64_t first = set_rank * q + std::min<std::int64_t>(set_rank, m);
  failures.expect_equal(
      compare_values(
          values_of(rs_out),
          std::vector<double>(full.begin() + first, full.begin() + first + q + (set_rank < m)),
          DataType::Float32),
      "reducescatter");
  // The object helpers and a barrier.
  const std::vector<std::string> objects =
      allgather_object(std::string(static_cast<std::size_t>(world_rank()), 'x'), "objs", set);
  failures.check(objects.size() == members.size(), "allgather_object count");
  for (std::size_t i = 0; i < objects.size() && i < members.size(); ++i) {
    failures.check(objects[i].size() == static_cast<std::size_t>(members[i]), "allgather_object");
  }
  failures.check(broadcast_object("root" + std::to_string(world_rank()), members.back(), "obj",
                                  set) == "root" + std::to_string(members.back()),
                 "broadcast_object");
  barrier(set);
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("repeated (cached) ops on sets resolve on every rank, members or not", "[process_set]") {
  Session session;
  if (world_size() == 1) return;
  const int parity = world_rank() % 2;
  ProcessSet even = add_process_set(ranks_with_parity(0));
  ProcessSet odd = add_process_set(ranks_with_parity(1));
  const ProcessSet set = parity == 0 ? even : odd;
  bool ok = true;
  // Cache hits travel to every rank; ranks outside the set must resolve them too.
  for (int i = 0; i < 6; ++i) {
    std::vector<float> v(3, 1.0f), g(3, 1.0f);
    Handle a = allreduce_async(TensorView(v.data(), {3}), "repeat",
                               {.op = ReduceOp::Sum, .process_set = set});
    Handle b = allreduce_async(TensorView(g.data(), {3}), "repeat", {.op = ReduceOp::Sum});
    const Tensor gathered = allgather(TensorView(v.data(), {1, 3}), "repeat.ag", set);
    a.wait();
    b.wait();
    ok = ok && v[2] == static_cast<float>(set.size()) && g[0] == static_cast<float>(world_size()) &&
         gathered.num_elements() == 3 * set.size();
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("concurrent ops with the same names on overlapping sets", "[process_set]") {
  Session session;
  if (world_size() < 3) return;
  // A = {0, 1}, B = {1, 2}: rank 1 is in both and submits in the opposite order to rank 0/2.
  ProcessSet a = add_process_set({0, 1});
  ProcessSet b = add_process_set({1, 2});
  const int rank = world_rank();
  std::vector<float> in_a(5, static_cast<float>(rank + 1)),
      in_b(5, static_cast<float>(10 * (rank + 1)));
  std::vector<float> global(5, 1.0f);
  std::vector<Handle> handles;
  if (rank == 1)
    handles.push_back(allreduce_async(TensorView(in_b.data(), {5}), "same",
                                      {.op = ReduceOp::Sum, .process_set = b}));
  if (a.included())
    handles.push_back(allreduce_async(TensorView(in_a.data(), {5}), "same",
                                      {.op = ReduceOp::Sum, .process_set = a}));
  if (b.included() && rank != 1) {
    handles.push_back(allreduce_async(TensorView(in_b.data(), {5}), "same",
                                      {.op = ReduceOp::Sum, .process_set = b}));
  }
  handles.push_back(allreduce_async(TensorView(global.data(), {5}), "same", {.op = ReduceOp::Sum}));
  for (Handle& h : handles) h.wait();
  bool ok = global[4] == static_cast<float>(world_size());
  if (a.included()) ok = ok && in_a[0] == 3.0f;   // 1 + 2
  if (b.included()) ok = ok && in_b[0] == 50.0f;  // 20 + 30
  CHECK(all_ranks(ok));
}

TEST_CASE("ops in flight on a removed set fail with ShutDown", "[process_set]") {
  Session session;
  if (world_size() < 3) return;  // {0, 1} must not be the global set.
  ProcessSet pair = add_process_set({0, 1});
  std::vector<float> v(3, 1.0f);
  Handle lonely;
  // Only rank 1 submits: rank 0 never will, so the removal must fail it rather than leave it.
  if (world_rank() == 1)
    lonely = allreduce_async(TensorView(v.data(), {3}), "lonely", {.process_set = pair});
  MPI_Barrier(MPI_COMM_WORLD);
  remove_process_set(pair);
  CHECK(all_ranks(world_rank() != 1 || error_of([&] { lonely.wait(); }) == ErrorCode::ShutDown));
  // The global set is unaffected.
  allreduce(TensorView(v.data(), {3}), "global", {.op = ReduceOp::Sum});
  CHECK(all_ranks(v[0] == static_cast<float>(world_size())));
}

TEST_CASE("sets do not outlive their session", "[process_set]") {
  if (world_size() < 2) return;
  {
    Session session;
    CHECK(all_ranks(add_process_set({0}).id() == 1));
  }
  Session session;
  CHECK(all_ranks(error_of([] { static_cast<void>(ProcessSet(1).size()); }) ==
                  ErrorCode::InvalidArgument));
  CHECK(all_ranks(add_process_set({0}).id() == 1));
}

}  // namespace
}  // namespace tutti::test
