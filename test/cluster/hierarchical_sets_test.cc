// SPDX-License-Identifier: Apache-2.0
// Hierarchical collectives on process sets (issue 17), run by the cluster suite on 3 hosts x 2
// ranks (mpirun --map-by slot: ranks 2h and 2h+1 on host h). The sets cover each way a set can
// lie on hosts: all six ranks (3 hosts x 2), {0,1,2,3} and {0,1,4,5} (2 hosts x 2, the second
// not on consecutive hosts), {1,2,3,4,5} (1+2+2 members: flat) and {0,2,4} (one per host:
// flat). Every dtype, op and scale factor of allreduce, fused batches, allgather with uneven
// rows and join, each against plain MPI over the same ranks (a split of MPI_COMM_WORLD). Run
// with TUTTI_FUSION_THRESHOLD=4096, so that tensors past the threshold stay small.
#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

const std::vector<std::vector<int>> kSets = {
    {0, 1, 2, 3}, {0, 1, 4, 5}, {1, 2, 3, 4, 5}, {0, 2, 4}};

// The global set and kSets, in that order. Collective.
std::vector<ProcessSet> make_sets() {
  std::vector<ProcessSet> sets = {ProcessSet::global()};
  for (const std::vector<int>& ranks : kSets) sets.push_back(add_process_set(ranks));
  return sets;
}

bool needs_six_ranks() {
  if (world_size() == 6) return false;
  WARN("hierarchical_sets_test needs 6 ranks (3 hosts x 2); nothing to check at " << world_size());
  return true;
}

// The plain-MPI result over `comm` (the set's ranks) of API.md's allreduce formula.
std::vector<double> oracle(const HostTensor& t, ReduceOp op, double prescale, double postscale,
                           MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<double> v = t.values();
  const MPI_Op mpi_op = op == ReduceOp::Min       ? MPI_MIN
                        : op == ReduceOp::Max     ? MPI_MAX
                        : op == ReduceOp::Product ? MPI_PROD
                                                  : MPI_SUM;
  if (mpi_op == MPI_SUM) {
    for (double& x : v) x *= prescale;
  }
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, mpi_op, comm);
  const bool scaled = op == ReduceOp::Average || prescale != 1.0 || postscale != 1.0;
  for (double& x : v) {
    if (mpi_op == MPI_SUM) x = x * postscale / (op == ReduceOp::Average ? size : 1);
    if (!is_floating(t.dtype()) && t.dtype() != DataType::Bool && scaled) x = std::trunc(x);
  }
  return v;
}

bool op_takes(ReduceOp op, DataType dtype) {
  return dtype != DataType::Bool || op == ReduceOp::Min || op == ReduceOp::Max;
}

TEST_CASE("Hierarchical allreduce on every kind of set: every dtype, op and scale",
          "[hierarchical][allreduce]") {
  if (needs_six_ranks()) return;
  Session session;
  const std::vector<ProcessSet> sets = make_sets();
  const ReduceOp op =
      GENERATE(ReduceOp::Average, ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product);
  Failures failures;
  for (const ProcessSet& set : sets) {
    SubComm oracle_comm(set.included() ? 0 : MPI_UNDEFINED);
    if (!set.included()) continue;
    // Every case of this set is submitted before any is waited for: fewer negotiation rounds.
    struct Case {
      HostTensor tensor;
      std::vector<double> expected;
      std::string what;
      ReduceOptions options;
      Handle handle;
    };
    std::vector<Case> cases;
    cases.reserve(200);
    // Every element size and kind (the mpi suite's sweep runs every dtype on the global set).
    for (DataType dtype :
         {DataType::UInt8, DataType::Int32, DataType::Int64, DataType::Float16, DataType::BFloat16,
          DataType::Float32, DataType::Float64, DataType::Bool}) {
      if (!op_takes(op, dtype)) continue;
      for (const auto& [prescale, postscale] : {std::pair{1.0, 1.0}, std::pair{0.5, 3.0}}) {
        if (op != ReduceOp::Sum && op != ReduceOp::Average && prescale != 1.0) continue;
        if (dtype == DataType::Bool && prescale != 1.0) continue;
        // 0, 1 and odd counts, one past the 4 KiB fusion threshold the suite sets (reduced in
        // pieces where it lies), the small ones fused into batches.
        for (std::int64_t n : {0, 1, 17, 4099, 5, 3}) {
          Case c{.tensor = HostTensor(dtype, Shape{n}, world_rank(), op == ReduceOp::Product),
                 .expected = {},
                 .what = "set " + std::to_string(set.id()) + " " + std::string(to_string(dtype)) +
                         " n=" + std::to_string(n) + " prescale " + std::to_string(prescale),
                 .options = {},
                 .handle = {}};
          // The oracle's MPI calls come first: none runs beside Tutti's.
          c.expected = oracle(c.tensor, op, prescale, postscale, oracle_comm.comm);
          c.options = {.op = op,
                       .prescale_factor = prescale,
                       .postscale_factor = postscale,
                       .process_set = set};
          cases.push_back(std::move(c));
        }
      }
    }
    for (Case& c : cases) c.handle = allreduce_async(c.tensor.view(), c.what, c.options);
    for (Case& c : cases) {
      c.handle.wait();
      failures.expect_equal(c.tensor.compare(c.expected), c.what);
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("Hierarchical allgather on every kind of set, uneven rows, fused and alone",
          "[hierarchical][allgather]") {
  if (needs_six_ranks()) return;
  Session session;
  const std::vector<ProcessSet> sets = make_sets();
  Failures failures;
  for (const ProcessSet& set : sets) {
    SubComm oracle_comm(set.included() ? 0 : MPI_UNDEFINED);
    if (!set.included()) continue;
    const int me = world_rank();
    // This rank's rows: (me % 3) rows of 3, so ranks 0 and 3 send none.
    const std::int64_t rows = me % 3;
    for (DataType dtype : {DataType::Float32, DataType::Int64, DataType::UInt8}) {
      HostTensor alone(dtype, Shape{rows, 3}, me, false);
      HostTensor a(dtype, Shape{rows + 1, 2}, me + 1, false), b(dtype, Shape{rows}, me + 2, false);
      const std::vector<double> want_alone = mpi_allgatherv(alone.values(), oracle_comm.comm);
      const std::vector<double> want_a = mpi_allgatherv(a.values(), oracle_comm.comm);
      const std::vector<double> want_b = mpi_allgatherv(b.values(), oracle_comm.comm);
      const Tensor got_alone = allgather(alone.view(), "alone", set);
      Handle ha = allgather_async(a.view(), "a", set);
      Handle hb = allgather_async(b.view(), "b", set);
      ha.wait();
      hb.wait();
      const std::string tag =
          "set " + std::to_string(set.id()) + " " + std::string(to_string(dtype));
      failures.expect_equal(compare_values(values_of(got_alone), want_alone, dtype),
                            tag + " alone");
      failures.expect_equal(compare_values(values_of(ha.output()), want_a, dtype), tag + " a");
      failures.expect_equal(compare_values(values_of(hb.output()), want_b, dtype), tag + " b");
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("Hierarchical ops with a joined member: zeros in allreduce, no rows in allgather",
          "[hierarchical][join]") {
  if (needs_six_ranks()) return;
  Session session;
  const std::vector<ProcessSet> sets = make_sets();
  Failures failures;
  for (const ProcessSet& set : {sets[0], sets[1]}) {  // 3 x 2 and 2 x 2: both hierarchical.
    if (!set.included()) continue;
    const std::vector<int> members = set.ranks();
    const int joiner = members.back();
    const int me = world_rank();
    if (me == joiner) {
      static_cast<void>(join(set));
      continue;
    }
    std::vector<float> grad(1001, static_cast<float>(me + 1));
    allreduce(TensorView(grad.data(), {1001}), "grad",
              {.op = ReduceOp::Average, .process_set = set});
    std::vector<float> mine(static_cast<std::size_t>(2 * (me + 1)), static_cast<float>(me));
    const Tensor all = allgather(TensorView(mine.data(), {me + 1, 2}), "rows", set);
    static_cast<void>(join(set));
    float sum = 0;
    std::vector<double> rows;
    for (int r : members) {
      if (r == joiner) continue;
      sum += static_cast<float>(r + 1);
      for (int i = 0; i < 2 * (r + 1); ++i) rows.push_back(r);
    }
    const std::vector<double> average(1001, sum / static_cast<float>(members.size()));
    const std::string tag = "set " + std::to_string(set.id());
    failures.expect_equal(
        compare_values(values_of(TensorView(grad.data(), {1001})), average, DataType::Float32),
        tag + " allreduce");
    failures.expect_equal(compare_values(values_of(all), rows, DataType::Float32),
                          tag + " allgather");
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

}  // namespace
}  // namespace tutti::test
