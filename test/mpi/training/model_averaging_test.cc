// SPDX-License-Identifier: Apache-2.0
// PeriodicModelAverager and HierarchicalModelAverager at 1-4 ranks: period 1 with SGD against
// synchronous DDP, the schedule (which steps average, over which set) against the closed form,
// the averages against plain MPI, an average while a member has joined against its closed form,
// and the argument errors. See Note [Collective assertions].
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include <catch2/catch.hpp>

#include "test/mpi/training/ddp_test_util.h"
#include "test/mpi/training/training_test_util.h"
#include "test/support/mpi_test_util.h"
#include "tutti/nn.h"
#include "tutti/optim.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

using nn::HierarchicalModelAverager;
using nn::PeriodicModelAverager;

// One local SGD step of `model` on this rank's own data (different on every rank).
void local_step(nn::Module& model, optim::SGD& sgd, int rank, int step) {
  sgd.zero_grad();
  forward_backward(model, make_batch(1000 * rank + 7 * step, 3));
  sgd.step();
}

// The mean over `comm` of `values` (plain MPI: the oracle).
std::vector<double> mean_over(const std::vector<double>& values, MPI_Comm comm) {
  std::vector<double> sum(values.size());
  MPI_Allreduce(values.data(), sum.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                comm);
  int members = 0;
  MPI_Comm_size(comm, &members);
  for (double& v : sum) v /= members;
  return sum;
}

bool close(const std::vector<double>& a, const std::vector<double>& b, double tolerance) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - b[i]) > tolerance) return false;
  }
  return true;
}

TEST_CASE("Period 1 with plain SGD equals synchronous DDP", "[averaging]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto local = make_model(41);  // Equal on every rank (same seed): no broadcast needed.
  nn::DistributedDataParallel ddp(make_model(41));
  optim::SGD local_sgd(variables(local->named_parameters()), {.lr = 0.1});
  optim::SGD ddp_sgd(variables(ddp.named_parameters()), {.lr = 0.1});
  PeriodicModelAverager averager(1);
  for (std::int64_t step = 0; step < 4; ++step) {
    local_sgd.zero_grad();
    forward_backward(*local, shard(rank, size, step));
    local_sgd.step();
    averager.average_parameters(local->named_parameters());
    ddp_sgd.zero_grad();
    forward_backward(ddp, shard(rank, size, step));
    ddp_sgd.step();
  }
  CHECK(all_ranks(max_diff(local->named_parameters(), ddp.named_parameters()) < 1e-6));
  CHECK(all_ranks(averager.step() == 4 && averager.num_averages() == 4));
}

TEST_CASE("PeriodicModelAverager averages after warm-up, every period, over its set",
          "[averaging]") {
  Session session;
  const int rank = tutti::rank();
  const int period = GENERATE(1, 3);
  const int warmup = GENERATE(0, 2);
  auto model = make_model(5);
  const nn::NamedParameters named = model->named_parameters();
  optim::SGD sgd(variables(named), {.lr = 0.1});
  PeriodicModelAverager averager(period, warmup);
  int expected_averages = 0;
  for (int step = 0; step < 9; ++step) {
    local_step(*model, sgd, rank, step);
    const std::vector<double> before = flatten_values(named);
    const std::vector<double> mean = mean_over(before, MPI_COMM_WORLD);
    averager.average_parameters(named);
    const bool due = step >= warmup && (step - warmup) % period == 0;
    expected_averages += due ? 1 : 0;
    const std::vector<double> after = flatten_values(named);
    INFO("period " << period << ", warm-up " << warmup << ", step " << step);
    // Averaged: the MPI mean. Not: untouched (and different across ranks, past size 1).
    CHECK(all_ranks(due ? close(after, mean, 1e-6) : after == before));
  }
  CHECK(all_ranks(averager.step() == 9 && averager.num_averages() == expected_averages));
  if (period == 3 && warmup == 2) CHECK(all_ranks(expected_averages == 3));  // Steps 2, 5, 8.
}

TEST_CASE("An average while a member has joined is over the members still training",
          "[averaging]") {
  // The last rank has run out of data and joined; the others' parameters, r + 1 + i on rank r,
  // average to n / 2 + i over ranks 0..n-2. Before, the joined rank's zeros were in the mean
  // and every value shrank by (n - 1) / n.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  if (size < 2) return;
  bool ok = true;
  if (rank == size - 1) {
    tutti::join();
  } else {
    Tensor value(DataType::Float32, {5});
    std::span<float> v = value.span<float>();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank + 1) + float(i);
    const nn::NamedParameters named = {{"w", nn::Variable(value, true)}};
    PeriodicModelAverager averager(1);
    averager.average_parameters(named);
    tutti::join();
    std::span<const float> after = named[0].second.value().span<float>();
    for (std::size_t i = 0; i < after.size(); ++i) {
      ok = ok && std::abs(double(after[i]) - (size / 2.0 + double(i))) < 1e-5;
    }
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("synchronize_step() after a join makes every member average at the same calls",
          "[averaging][join]") {
  // Period 2. Rank 0 makes three calls in the first epoch, the others two before they join;
  // after synchronize_step() every step() is 3, and in the second epoch the calls at steps 4
  // and 6 (the second and fourth) average on every member. Without it the early joiners
  // averaged at their third call of that epoch and rank 0 at its second, paired silently.
  // Closed form: before call i of the epoch, rank r's value is 1000 (r + 1) + i; an average is
  // 1000 (size + 1) / 2 + i.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const bool hierarchical = GENERATE(false, true);
  INFO("hierarchical " << hierarchical);
  nn::Variable a(Tensor(DataType::Float32, {1}), true);
  const nn::NamedParameters params = {{"a", a}};
  PeriodicModelAverager periodic(2);
  HierarchicalModelAverager nested({{2, ProcessSet::global()}});  // The same schedule.
  const auto call = [&] {
    if (hierarchical) {
      nested.average_parameters(params);
    } else {
      periodic.average_parameters(params);
    }
  };
  for (int i = 0; i < (rank == 0 ? 3 : 2); ++i) call();
  tutti::join();
  const std::int64_t step = hierarchical ? nested.synchronize_step() : periodic.synchronize_step();
  CHECK(all_ranks(step == 3 && (hierarchical ? nested.step() : periodic.step()) == 3));
  bool ok = true;
  for (int i = 0; i < 4; ++i) {
    a.value().span<float>()[0] = static_cast<float>(1000 * (rank + 1) + i);
    call();
    const bool averaged = i % 2 == 1;
    const double expected = (averaged ? 1000.0 * (size + 1) / 2 : 1000.0 * (rank + 1)) + i;
    ok = ok && a.value().span<float>()[0] == static_cast<float>(expected);
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("HierarchicalModelAverager averages within pairs every 2 steps, globally every 4",
          "[averaging]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  // Pairs {0, 1}, {2, 3}, ... (the last one alone at odd sizes). A pair equal to the global set
  // is the global set (add_process_set refuses duplicates).
  std::vector<ProcessSet> pairs;
  for (int first = 0; first < size; first += 2) {
    std::vector<int> members = {first};
    if (first + 1 < size) members.push_back(first + 1);
    pairs.push_back(static_cast<int>(members.size()) == size ? ProcessSet::global()
                                                             : add_process_set(members));
  }
  const ProcessSet mine = pairs[static_cast<std::size_t>(rank / 2)];
  MPI_Comm pair_comm = MPI_COMM_NULL;  // The oracle's pair.
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pair_comm);
  {
    auto model = make_model(8);
    const nn::NamedParameters named = model->named_parameters();
    optim::SGD sgd(variables(named), {.lr = 0.1});
    HierarchicalModelAverager averager({{2, mine}, {4, ProcessSet::global()}}, /*warmup=*/1);
    for (int step = 0; step < 9; ++step) {
      local_step(*model, sgd, rank, step);
      const std::vector<double> before = flatten_values(named);
      const std::vector<double> global_mean = mean_over(before, MPI_COMM_WORLD);
      const std::vector<double> pair_mean = mean_over(before, pair_comm);
      averager.average_parameters(named);
      const std::vector<double> after = flatten_values(named);
      // Step 0 is warm-up; then the largest period dividing the step decides.
      const bool global = step >= 1 && step % 4 == 0;
      const bool pair = step >= 1 && !global && step % 2 == 0;
      INFO("step " << step);
      CHECK(all_ranks(global ? close(after, global_mean, 1e-6)
                      : pair ? close(after, pair_mean, 1e-6)
                             : after == before));
    }
    CHECK(all_ranks(averager.num_averages() == 4));  // Steps 2, 4, 6, 8.
  }
  MPI_Comm_free(&pair_comm);
  for (const ProcessSet& set : pairs) {
    if (set.id() != 0) remove_process_set(set);
  }
}

TEST_CASE("Averagers refuse bad periods and sets", "[averaging][errors]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto code = [](auto&& f) { return error_from(f).first; };
  const ErrorCode bad = ErrorCode::InvalidArgument;
  CHECK(all_ranks(code([] { PeriodicModelAverager(0); }) == bad));
  CHECK(all_ranks(code([] { PeriodicModelAverager(2, -1); }) == bad));
  CHECK(all_ranks(code([] { HierarchicalModelAverager({}); }) == bad));
  CHECK(all_ranks(code([] { HierarchicalModelAverager({{0, ProcessSet::global()}}); }) == bad));
  CHECK(all_ranks(code([] { HierarchicalModelAverager({{2, ProcessSet::global()}}, -1); }) == bad));
  PeriodicModelAverager fine(2);
  nn::NamedParameters with_empty = {{"x", nn::Variable()}};
  CHECK(all_ranks(code([&] { fine.average_parameters(with_empty); }) == bad));
  CHECK(all_ranks(fine.step() == 0));
  if (size < 3) return;  // Sets that differ from the global set. The same on every rank.
  ProcessSet first = add_process_set({0, 1});
  ProcessSet last = add_process_set({size - 1});
  // A set without this rank; sets that do not nest (global at the smaller period).
  const ProcessSet other = rank <= 1 ? last : first;
  CHECK(all_ranks(code([&] { PeriodicModelAverager(1, 0, other); }) == bad));
  CHECK(all_ranks(code([&] { HierarchicalModelAverager({{2, other}}); }) == bad));
  const ProcessSet own = rank <= 1 ? first : (rank == size - 1 ? last : ProcessSet::global());
  CHECK(all_ranks(code([&] {
                    HierarchicalModelAverager({{2, ProcessSet::global()}, {4, own}});
                  }) == (own.id() == 0 ? ErrorCode::Internal : bad)));
  remove_process_set(last);
  remove_process_set(first);
}

}  // namespace
}  // namespace tutti::test
