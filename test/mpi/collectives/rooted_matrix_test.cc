// SPDX-License-Identifier: Apache-2.0
// Issue 13: reduce, gather and scatter over every dtype, reduce op and root, with scale
// factors, uneven gather rows and scatter splits (zero rows on a rank), Mismatch on every rank
// for a disputed shape or dtype, join, and process sets (roots given as global ranks).
// Expected values are closed forms of the generators below, never the code under test.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

// Host data of any dtype built from doubles.
struct Data {
  DataType dtype;
  Shape shape;
  std::vector<std::byte> bytes;
  Data(DataType type, Shape s, const std::vector<double>& values)
      : dtype(type),
        shape(std::move(s)),
        bytes(std::max<std::size_t>(1, values.size() * element_size(type))) {
    for (std::size_t i = 0; i < values.size(); ++i)
      store(bytes.data() + i * element_size(dtype), dtype, values[i]);
  }
  TensorView view() { return TensorView(bytes.data(), dtype, shape); }
};

// Rank s's element i: small integers (1 and 2 for Product, 0 and 1 for Bool).
double element(int s, int i, ReduceOp op, DataType dtype) {
  if (dtype == DataType::Bool) return (i + s) % 2;
  if (op == ReduceOp::Product) return (i + s) % 2 + 1;
  return (i + 2 * s) % 5;
}

// The closed form of reduce over `members` (global ranks) for element i.
double reduced(const std::vector<int>& members, int i, ReduceOp op, DataType dtype, double prescale,
               double postscale) {
  double acc = op == ReduceOp::Product ? 1
               : op == ReduceOp::Min   ? 1e9
               : op == ReduceOp::Max   ? -1e9
                                       : 0;
  for (int s : members) {
    const double x = element(s, i, op, dtype);
    if (op == ReduceOp::Product)
      acc *= x;
    else if (op == ReduceOp::Min)
      acc = std::min(acc, x);
    else if (op == ReduceOp::Max)
      acc = std::max(acc, x);
    else
      acc += prescale * x;
  }
  if (op != ReduceOp::Sum && op != ReduceOp::Average) return acc;
  acc = acc * postscale / (op == ReduceOp::Average ? static_cast<double>(members.size()) : 1.0);
  const bool scaled = op == ReduceOp::Average || prescale != 1.0 || postscale != 1.0;
  return !is_floating(dtype) && scaled ? std::trunc(acc) : acc;
}

std::vector<double> rank_values(int s, int count, ReduceOp op, DataType dtype) {
  std::vector<double> v(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) v[static_cast<std::size_t>(i)] = element(s, i, op, dtype);
  return v;
}

std::vector<int> all_members() {
  std::vector<int> m(static_cast<std::size_t>(world_size()));
  for (int s = 0; s < world_size(); ++s) m[static_cast<std::size_t>(s)] = s;
  return m;
}

// One reduce on `set` at `root`, checked on every member.
void check_reduce(const std::vector<int>& members, const ProcessSet& set, int root, DataType dtype,
                  ReduceOp op, double prescale, double postscale, Failures& failures) {
  const int me = world_rank();
  constexpr int kCount = 7;
  const std::vector<double> mine = rank_values(me, kCount, op, dtype);
  Data data(dtype, {kCount}, mine);
  const std::string tag = std::string(to_string(dtype)) + " " + std::string(to_string(op)) +
                          " root " + std::to_string(root) + " scale " + std::to_string(prescale) +
                          "/" + std::to_string(postscale);
  reduce(
      data.view(), root, "matrix.reduce",
      {.op = op, .prescale_factor = prescale, .postscale_factor = postscale, .process_set = set});
  std::vector<double> expected = mine;
  if (me == root) {
    for (int i = 0; i < kCount; ++i)
      expected[static_cast<std::size_t>(i)] = reduced(members, i, op, dtype, prescale, postscale);
  }
  failures.expect_equal(compare_values(values_of(data.view()), expected, dtype),
                        tag + (me == root ? ": root result" : ": non-root changed"));
}

TEST_CASE("reduce: every dtype, op and root against closed forms", "[rooted][reduce]") {
  Session session;
  Failures failures;
  const std::vector<int> members = all_members();
  for (DataType dtype : kAllDtypes) {
    for (ReduceOp op :
         {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
      if (dtype == DataType::Bool && op != ReduceOp::Min && op != ReduceOp::Max) continue;
      for (int root = 0; root < world_size(); ++root)
        check_reduce(members, ProcessSet::global(), root, dtype, op, 1.0, 1.0, failures);
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("reduce: prescale and postscale, with the integer rule", "[rooted][reduce]") {
  Session session;
  Failures failures;
  const std::vector<int> members = all_members();
  for (DataType dtype : kAllDtypes) {
    if (dtype == DataType::Bool) continue;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
      for (int root = 0; root < world_size(); ++root)
        check_reduce(members, ProcessSet::global(), root, dtype, op, 0.5, 3.0, failures);
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

// Rank s gives rows(s) rows of 3 values 1000 s + 10 k + j (k the row, j the column); rank 0
// and every third rank give none.
std::int64_t gather_rows(int s) { return s % 3 == 0 ? 0 : s; }
double gather_value(int s, std::int64_t k, int j, DataType dtype) {
  if (dtype == DataType::Bool) return (s + k + j) % 2;
  // Kept within int8 and exact in bfloat16 (8 bits of mantissa).
  return static_cast<double>((16 * s + 4 * k + j) % 100);
}

void check_gather(const std::vector<int>& members, const ProcessSet& set, int root, DataType dtype,
                  Failures& failures) {
  const int me = world_rank();
  std::vector<double> mine;
  for (std::int64_t k = 0; k < gather_rows(me); ++k)
    for (int j = 0; j < 3; ++j) mine.push_back(gather_value(me, k, j, dtype));
  Data data(dtype, {gather_rows(me), 3}, mine);
  const Tensor out = gather(data.view(), root, "matrix.gather", set);
  const std::string tag = std::string(to_string(dtype)) + " gather root " + std::to_string(root);
  if (me != root) {
    failures.check(out.num_elements() == 0 && out.data() == nullptr, tag + ": non-root output");
    return;
  }
  std::vector<double> expected;
  std::int64_t rows = 0;
  for (int s : members) {
    rows += gather_rows(s);
    for (std::int64_t k = 0; k < gather_rows(s); ++k)
      for (int j = 0; j < 3; ++j) expected.push_back(gather_value(s, k, j, dtype));
  }
  failures.check(out.shape() == Shape{rows, 3} && out.dtype() == dtype, tag + ": shape/dtype");
  failures.expect_equal(compare_values(values_of(out), expected, dtype), tag);
}

TEST_CASE("gather: every dtype and root, uneven rows, zero rows on some ranks",
          "[rooted][gather]") {
  Session session;
  Failures failures;
  const std::vector<int> members = all_members();
  for (DataType dtype : kAllDtypes)
    for (int root = 0; root < world_size(); ++root)
      check_gather(members, ProcessSet::global(), root, dtype, failures);
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

// The root's input: rows 0.. of 2 values (7 k + j) % 100; set-rank i gets splits[i] rows,
// set-rank 0 none, the rest i + 1 each, and one row more than needed is left unsent.
void check_scatter(const std::vector<int>& members, const ProcessSet& set, int root, DataType dtype,
                   Failures& failures) {
  const int me = world_rank();
  const int n = static_cast<int>(members.size());
  std::vector<std::int64_t> splits;
  std::int64_t rows = 1;  // The unsent last row.
  for (int i = 0; i < n; ++i) {
    splits.push_back(i == 0 ? 0 : i + 1);
    rows += splits.back();
  }
  auto value = [&](std::int64_t k, int j) {
    return dtype == DataType::Bool ? static_cast<double>((k + j) % 2)
                                   : static_cast<double>((7 * k + j) % 100);
  };
  std::vector<double> input;
  if (me == root)
    for (std::int64_t k = 0; k < rows; ++k)
      for (int j = 0; j < 2; ++j) input.push_back(value(k, j));
  Data data(dtype, me == root ? Shape{rows, 2} : Shape{0}, input);
  // Non-roots pass splits that must be ignored.
  const Tensor out = scatter(data.view(), root, me == root ? splits : std::vector<std::int64_t>{5},
                             "matrix.scatter", set);
  const int set_rank =
      static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  std::int64_t first = 0;
  for (int i = 0; i < set_rank; ++i) first += splits[static_cast<std::size_t>(i)];
  std::vector<double> expected;
  for (std::int64_t k = first; k < first + splits[static_cast<std::size_t>(set_rank)]; ++k)
    for (int j = 0; j < 2; ++j) expected.push_back(value(k, j));
  const std::string tag = std::string(to_string(dtype)) + " scatter root " + std::to_string(root);
  failures.check(
      out.shape() == Shape{splits[static_cast<std::size_t>(set_rank)], 2} && out.dtype() == dtype,
      tag + ": shape/dtype");
  failures.expect_equal(compare_values(values_of(out), expected, dtype), tag);
}

TEST_CASE("scatter: every dtype and root, uneven splits, zero rows to a rank",
          "[rooted][scatter]") {
  Session session;
  Failures failures;
  const std::vector<int> members = all_members();
  for (DataType dtype : kAllDtypes)
    for (int root = 0; root < world_size(); ++root)
      check_scatter(members, ProcessSet::global(), root, dtype, failures);
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("rooted ops: a disputed shape or dtype is Mismatch on every rank", "[rooted]") {
  if (world_size() < 2) return;
  Session session;
  const int me = world_rank();
  std::vector<double> v(8, 1.0);
  // reduce: rank 0 sends 3 elements, the others 4.
  CHECK(all_ranks(error_of([&] {
                    reduce(TensorView(v.data(), {me == 0 ? 3 : 4}), 0, "mm.reduce.shape",
                           {.op = ReduceOp::Sum});
                  }) == ErrorCode::Mismatch));
  // reduce: rank 0 float64, the others float32 (the same bytes reinterpreted).
  CHECK(all_ranks(error_of([&] {
                    reduce(
                        TensorView(v.data(), me == 0 ? DataType::Float64 : DataType::Float32, {2}),
                        world_size() - 1, "mm.reduce.dtype", {.op = ReduceOp::Sum});
                  }) == ErrorCode::Mismatch));
  // gather: trailing dims differ.
  CHECK(all_ranks(
      error_of([&] {
        static_cast<void>(gather(TensorView(v.data(), {1, me == 0 ? 2 : 3}), 1, "mm.gather.shape"));
      }) == ErrorCode::Mismatch));
  // gather: dtypes differ.
  CHECK(all_ranks(error_of([&] {
                    static_cast<void>(gather(
                        TensorView(v.data(), me == 0 ? DataType::Float64 : DataType::Int64, {2}), 0,
                        "mm.gather.dtype"));
                  }) == ErrorCode::Mismatch));
  // scatter: a non-root names another dtype than the root's.
  CHECK(all_ranks(error_of([&] {
                    static_cast<void>(scatter(me == 0 ? TensorView(v.data(), {world_size(), 1})
                                                      : TensorView(nullptr, DataType::Int32, {0}),
                                              0, {}, "mm.scatter.dtype"));
                  }) == ErrorCode::Mismatch));
  // Still usable afterwards.
  std::vector<double> after(2, 1.0);
  reduce(TensorView(after.data(), {2}), 0, "mm.after", {.op = ReduceOp::Sum});
  CHECK(all_ranks(me != 0 || after[0] == world_size()));
}

TEST_CASE("rooted ops with a joined rank", "[rooted][join]") {
  if (world_size() < 2) return;
  Session session;
  Failures failures;
  const int me = world_rank();
  const int n = world_size();
  for (int first = 0; first < n; ++first) {
    const std::string tag = "joined " + std::to_string(first);
    if (me == first) {
      static_cast<void>(join());
      continue;
    }
    const int root = (first + 1) % n;  // A member that has not joined.
    std::vector<int> others;
    for (int s = 0; s < n; ++s)
      if (s != first) others.push_back(s);
    // reduce: the joined rank contributes zeros (the identity of Sum).
    std::vector<double> mine = rank_values(me, 7, ReduceOp::Sum, DataType::Float64);
    Data data(DataType::Float64, {7}, mine);
    reduce(data.view(), root, "join.reduce", {.op = ReduceOp::Sum});
    std::vector<double> expected = mine;
    if (me == root)
      for (int i = 0; i < 7; ++i)
        expected[static_cast<std::size_t>(i)] =
            reduced(others, i, ReduceOp::Sum, DataType::Float64, 1.0, 1.0);
    failures.expect_equal(compare_values(values_of(data.view()), expected, DataType::Float64),
                          tag + ": reduce");
    // gather: without the joined rank's rows.
    std::vector<double> rows;
    for (std::int64_t k = 0; k < gather_rows(me); ++k)
      for (int j = 0; j < 3; ++j) rows.push_back(gather_value(me, k, j, DataType::Int32));
    Data rows_data(DataType::Int32, {gather_rows(me), 3}, rows);
    const Tensor out = gather(rows_data.view(), root, "join.gather");
    if (me == root) {
      std::vector<double> all;
      for (int s : others)
        for (std::int64_t k = 0; k < gather_rows(s); ++k)
          for (int j = 0; j < 3; ++j) all.push_back(gather_value(s, k, j, DataType::Int32));
      failures.expect_equal(compare_values(values_of(out), all, DataType::Int32), tag + ": gather");
    }
    // A joined root, and any scatter, are InvalidArgument from wait().
    std::vector<float> v(static_cast<std::size_t>(n), 1.0f);
    Handle h = reduce_async(TensorView(v.data(), {n}), first, "join.root");
    failures.check(error_of([&] { h.wait(); }) == ErrorCode::InvalidArgument,
                   tag + ": reduce at the joined root");
    Handle g = gather_async(TensorView(v.data(), {n}), first, "join.gather.root");
    failures.check(error_of([&] { g.wait(); }) == ErrorCode::InvalidArgument,
                   tag + ": gather at the joined root");
    failures.check(
        error_of([&] {
          static_cast<void>(scatter(
              me == root ? TensorView(v.data(), {n}) : TensorView(nullptr, DataType::Float32, {0}),
              root, {}, "join.scatter"));
        }) == ErrorCode::InvalidArgument,
        tag + ": scatter while a rank has joined");
    static_cast<void>(join());
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("rooted ops on process sets: global roots, members only", "[rooted][process_set]") {
  if (world_size() < 2) return;
  Session session;
  Failures failures;
  std::vector<int> even, odd;
  for (int s = 0; s < world_size(); ++s) (s % 2 == 0 ? even : odd).push_back(s);
  const ProcessSet set_even = add_process_set(even);
  const ProcessSet set_odd = add_process_set(odd);
  const ProcessSet& mine = world_rank() % 2 == 0 ? set_even : set_odd;
  const std::vector<int>& members = world_rank() % 2 == 0 ? even : odd;
  const std::vector<int>& others = world_rank() % 2 == 0 ? odd : even;
  for (int root : members) {
    for (DataType dtype : {DataType::Float32, DataType::Int32, DataType::Float16}) {
      check_reduce(members, mine, root, dtype, ReduceOp::Sum, 1.0, 1.0, failures);
      check_reduce(members, mine, root, dtype, ReduceOp::Average, 1.0, 1.0, failures);
      check_gather(members, mine, root, dtype, failures);
      check_scatter(members, mine, root, dtype, failures);
    }
  }
  // A root outside the set is InvalidArgument from the call, as is a set this rank is not in.
  std::vector<float> v(2, 1.0f);
  failures.check(error_of([&] {
                   reduce_async(TensorView(v.data(), {2}), others.front(), "outside",
                                {.process_set = mine});
                 }) == ErrorCode::InvalidArgument,
                 "root outside the set");
  const ProcessSet& other_set = world_rank() % 2 == 0 ? set_odd : set_even;
  failures.check(error_of([&] {
                   gather_async(TensorView(v.data(), {2}), others.front(), "not.member", other_set);
                 }) == ErrorCode::InvalidArgument,
                 "a set this rank is not in");
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
  barrier();
  remove_process_set(set_even);
  remove_process_set(set_odd);
}

}  // namespace
}  // namespace tutti::test
