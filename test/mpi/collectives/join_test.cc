// SPDX-License-Identifier: Apache-2.0
// join(): each rank joining first, with and without a warm response cache, on the global set
// and on a process set. While a rank has joined, the others' allreduces see zeros from it
// (Average still divides by the full size), allgathers skip its rows, a broadcast from it and
// alltoall/reducescatter fail with InvalidArgument, and every member gets the same result.
#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

// Values of rank r's inputs: every element r + 1.
std::vector<float> filled(std::size_t n, int rank) {
  return std::vector<float>(n, static_cast<float>(rank + 1));
}

// One round on `set`: set member `first` joins at once; `last` (another member) joins after
// every other member, which its probe allreduce proves: with the others joined, the probe
// can complete only once they all have. Returns this rank's failures.
void join_round(const ProcessSet& set, int first, bool warm, Failures& failures) {
  if (!set.included()) return;
  const std::vector<int> members = set.ranks();
  const int n = static_cast<int>(members.size());
  const int me = world_rank();
  const int last =
      n == 1 ? first
             : members[static_cast<std::size_t>(
                   (std::find(members.begin(), members.end(), first) - members.begin() + 1) % n)];
  const std::string tag = "first " + std::to_string(first) + (warm ? " warm" : " cold") + " set " +
                          std::to_string(set.id());
  if (warm) {
    // Cache these names, so the ops below would be cache hits without the join.
    for (int i = 0; i < 3; ++i) {
      std::vector<float> grad = filled(6, me);
      allreduce(TensorView(grad.data(), {6}), "grad", {.op = ReduceOp::Sum, .process_set = set});
      std::vector<float> rows = filled(static_cast<std::size_t>(2 * (me + 1)), me);
      static_cast<void>(allgather(TensorView(rows.data(), {me + 1, 2}), "rows", set));
    }
  }
  std::vector<float> pre = filled(4, me);
  Handle pre_handle = allreduce_async(TensorView(pre.data(), {4}), "pre",
                                      {.op = ReduceOp::Sum, .process_set = set});
  float all_sum = 0, others_sum = 0;
  for (int r : members) {
    all_sum += static_cast<float>(r + 1);
    if (r != first) others_sum += static_cast<float>(r + 1);
  }
  int result = -1;
  if (me == first) {
    result = join(set);
  } else {
    // Fused in one batch each on the joined rank too (no entries there).
    std::vector<float> grad = filled(6, me), avg = filled(6, me);
    Handle h1 = allreduce_async(TensorView(grad.data(), {6}), "grad",
                                {.op = ReduceOp::Sum, .process_set = set});
    Handle h2 = allreduce_async(TensorView(avg.data(), {6}), "grad.avg",
                                {.op = ReduceOp::Average, .process_set = set});
    std::vector<float> rows = filled(static_cast<std::size_t>(2 * (me + 1)), me);
    Handle h3 = allgather_async(TensorView(rows.data(), {me + 1, 2}), "rows", set);
    Handle h4 = allgather_async(TensorView(rows.data(), {me + 1, 2}), "rows.again", set);
    h1.wait();
    h2.wait();
    failures.check(grad[5] == others_sum, tag + ": Sum with zeros from the joined rank");
    failures.check(std::abs(avg[0] - others_sum / static_cast<float>(n)) < 1e-5f,
                   tag + ": Average over the full set");
    std::vector<double> expected_rows;
    for (int r : members) {
      if (r != first)
        expected_rows.insert(expected_rows.end(), static_cast<std::size_t>(2 * (r + 1)), r + 1);
    }
    failures.expect_equal(compare_values(values_of(h3.output()), expected_rows, DataType::Float32),
                          tag + ": allgather");
    failures.expect_equal(compare_values(values_of(h4.output()), expected_rows, DataType::Float32),
                          tag + ": allgather 2");
    // A broadcast from the joined rank fails; one from another member works.
    std::vector<float> b = filled(3, me);
    failures.check(error_of([&] {
                     broadcast(TensorView(b.data(), {3}), first, "from.joined", set);
                   }) == ErrorCode::InvalidArgument,
                   tag + ": broadcast from the joined rank");
    broadcast(TensorView(b.data(), {3}), last, "from.last", set);
    failures.check(b[2] == static_cast<float>(last + 1), tag + ": broadcast from a member");
    std::vector<float> m(static_cast<std::size_t>(2 * n), 1.0f);
    std::string message;
    failures.check(error_of([&] { alltoall(TensorView(m.data(), {2 * n}), {}, "a2a", set); },
                            &message) == ErrorCode::InvalidArgument &&
                       message.find(std::to_string(first)) != std::string::npos,
                   tag + ": alltoall");
    failures.check(error_of([&] {
                     reducescatter(TensorView(m.data(), {2 * n}), "rs",
                                   {.op = ReduceOp::Sum, .process_set = set});
                   }) == ErrorCode::InvalidArgument,
                   tag + ": reducescatter");
    barrier(set);
    if (me == last) {
      std::vector<float> probe = filled(2, me);
      allreduce(TensorView(probe.data(), {2}), "probe", {.op = ReduceOp::Sum, .process_set = set});
      failures.check(probe[0] == static_cast<float>(me + 1), tag + ": probe sees only zeros");
    }
    result = join(set);
  }
  pre_handle.wait();
  failures.check(pre[0] == all_sum, tag + ": an op submitted before join keeps the joiner's data");
  failures.check(result == last, tag + ": join() returned " + std::to_string(result) +
                                     ", expected " + std::to_string(last));
  // Usable afterwards, with every member again.
  std::vector<float> grad = filled(6, me);
  allreduce(TensorView(grad.data(), {6}), "grad", {.op = ReduceOp::Sum, .process_set = set});
  failures.check(grad[0] == all_sum, tag + ": allreduce after the join");
}

TEST_CASE("each rank joining first, with a cold and a warm cache", "[join]") {
  Failures failures;
  for (int first = 0; first < world_size(); ++first) {
    for (bool warm : {false, true}) {
      Session session;
      join_round(ProcessSet::global(), first, warm, failures);
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("join twice in one session", "[join]") {
  Session session;
  Failures failures;
  join_round(ProcessSet::global(), world_size() - 1, true, failures);
  join_round(ProcessSet::global(), 0, true, failures);
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("join on a process set leaves the other ranks alone", "[join][process_set]") {
  if (world_size() < 3) return;
  Session session;
  std::vector<int> even;
  for (int r = 0; r < world_size(); r += 2) even.push_back(r);
  ProcessSet set = add_process_set(even);
  Failures failures;
  for (int first : even) {
    join_round(set, first, first != 0, failures);
    // The global set never saw a join: its ops need every rank.
    std::vector<float> v(2, 1.0f);
    allreduce(TensorView(v.data(), {2}), "global", {.op = ReduceOp::Sum});
    failures.check(v[0] == static_cast<float>(world_size()), "global allreduce");
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

}  // namespace
}  // namespace tutti::test
