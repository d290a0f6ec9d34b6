// SPDX-License-Identifier: Apache-2.0
// Every kind of collective in one stream. Each step draws the same ops on every rank (kind,
// process set, dtype, shape, reduction and scale factors, root, and a name from a small pool,
// so that names recur with the same shape, another shape or another kind), every member submits
// its ops in an order of its own, and each result is checked against a closed form of the
// members' inputs. The per-kind tests shuffle one kind at a time; here allreduces, gathers,
// broadcasts, alltoalls, reducescatters and rooted ops of several sets share the negotiation,
// the response cache and fusion in the same cycles. A second case has one member submit an op
// of the stream with another dtype now and then: only that op fails, on every member.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

enum class Kind {
  Allreduce,
  AllreduceOutOfPlace,
  GroupedAllreduce,
  Allgather,
  GroupedAllgather,
  Broadcast,
  Alltoall,
  Reducescatter,
  Reduce,
  Gather,
  Scatter,
};
constexpr int kKinds = 11;
constexpr int kSets = 3;
constexpr int kGroup = 2;              // Tensors of a grouped op.
constexpr int kMaxDraws = 40;          // Ops a step.
constexpr int kNames = 8 + kMaxDraws;  // Per kind and set (see draw()).

// Element i of tensor t of op j on global rank r: small integers, so that every sum, product
// and scaled result below is exact in every dtype drawn (float16's 2048 included).
double value(int r, int j, int t, std::int64_t i) { return (r + 1) * 3 + (7 * i + j + 5 * t) % 11; }

// One op of a step, the same on every rank: what to submit and what the result must be.
struct Draw {
  Kind kind = Kind::Allreduce;
  int set = 0;  // Index into the test's sets.
  DataType dtype = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  double prescale = 1.0;
  double postscale = 1.0;
  std::int64_t cols = 1;
  std::int64_t rows = 0;  // Reducescatter's dim 0.
  int root = 0;           // A global rank of the set.
  std::string name;
};

// Rows that set rank q contributes to op j of step s (allgather, gather), and that set rank
// `from` sends to set rank `to` (alltoall; scatter from its root).
std::int64_t gathered_rows(int q, int j, int t, int s) { return 1 + (j + 3 * q + t + s) % 4; }
std::int64_t sent_rows(int from, int to, int j, int s) { return (from + to + j + s) % 3; }

// API.md's formula: exact in the integer type when it is neither scaled nor averaged, else
// trunc(postscale · reduce(prescale · x) [/ size]) computed in double.
double reduced(const Draw& d, const std::vector<int>& members, int j, int t, std::int64_t i) {
  const bool integer = d.dtype == DataType::Int32;
  double acc = d.op == ReduceOp::Product ? 1.0 : 0.0;
  bool first = true;
  for (int m : members) {
    const double x = d.prescale * value(m, j, t, i);
    if (d.op == ReduceOp::Min)
      acc = first ? x : std::min(acc, x);
    else if (d.op == ReduceOp::Max)
      acc = first ? x : std::max(acc, x);
    else if (d.op == ReduceOp::Product)
      acc *= x;
    else
      acc += x;
    first = false;
  }
  if (d.op == ReduceOp::Average) acc /= static_cast<double>(members.size());
  acc *= d.postscale;
  return integer ? std::trunc(acc) : acc;
}

// `names_taken` marks the names this step has used, kNames per kind and set.
Draw draw(std::mt19937& g, const std::vector<std::vector<int>>& members,
          std::vector<bool>& names_taken) {
  Draw d;
  d.kind = static_cast<Kind>(g() % kKinds);
  d.set = static_cast<int>(g() % members.size());
  const std::vector<int>& set = members[static_cast<std::size_t>(d.set)];
  constexpr DataType kDtypes[] = {DataType::Float32, DataType::Float64, DataType::Int32,
                                  DataType::Float16};
  d.dtype = kDtypes[g() % 4];
  constexpr std::int64_t kCols[] = {1, 2, 5, 17, 1000, 40000};
  d.cols = kCols[g() % 6];
  constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Average,
                               ReduceOp::Product};
  d.op = kOps[g() % 5];
  if (d.op == ReduceOp::Product) {  // Keeps products in float16's and int32's exact range.
    d.dtype = d.dtype == DataType::Float16 ? DataType::Float32 : d.dtype;
    d.cols = std::min<std::int64_t>(d.cols, 17);
  }
  if (g() % 3 == 0) {
    d.prescale = 0.5 * (1 + g() % 3);
    d.postscale = 0.5 * (1 + g() % 4);
  }
  if (d.kind == Kind::Reducescatter) {  // Sum or Average only.
    d.op = g() % 2 ? ReduceOp::Sum : ReduceOp::Average;
    d.rows = 1 + g() % 9;
  }
  d.root = set[g() % set.size()];
  // One of the first 8 names of this kind and set, or the next one this step has not used:
  // mostly the same few names step after step, so that they recur with the same shape (cache
  // hits), another shape or dtype (a changed op under a cached name), and on other kinds' sets.
  const std::size_t pool =
      (static_cast<std::size_t>(d.kind) * kSets + static_cast<std::size_t>(d.set)) * kNames;
  std::size_t n = g() % 8;
  while (names_taken[pool + n]) ++n;
  names_taken[pool + n] = true;
  d.name = "mixed.k" + std::to_string(static_cast<int>(d.kind)) + ".s" + std::to_string(d.set) +
           "." + std::to_string(n);
  return d;
}

// The op's name, dtype, and reduction where it reduces.
std::string describe(const Draw& d) {
  const bool reduces = d.kind == Kind::Allreduce || d.kind == Kind::AllreduceOutOfPlace ||
                       d.kind == Kind::GroupedAllreduce || d.kind == Kind::Reducescatter ||
                       d.kind == Kind::Reduce;
  std::string what = d.name + " (" + std::string(to_string(d.dtype));
  if (reduces) {
    what += ", " + std::string(to_string(d.op)) + " scaled " + std::to_string(d.prescale) +
            " and " + std::to_string(d.postscale);
  }
  return what + ")";
}

Tensor filled(DataType dtype, Shape shape, int r, int j, int t) {
  Tensor tensor(dtype, std::move(shape));
  auto* p = static_cast<std::byte*>(tensor.data());
  for (std::int64_t i = 0; i < tensor.num_elements(); ++i)
    store(p + i * static_cast<std::int64_t>(element_size(dtype)), dtype, value(r, j, t, i));
  return tensor;
}

// What this rank submitted for one draw.
struct Submitted {
  std::vector<Tensor> inputs;
  Tensor output;  // Out-of-place allreduce.
  Handle handle;
};

Submitted submit(const Draw& d, int j, int s, const ProcessSet& set, int q, int n) {
  const int r = world_rank();
  Submitted out;
  const ReduceOptions options{.op = d.op,
                              .prescale_factor = d.prescale,
                              .postscale_factor = d.postscale,
                              .process_set = set};
  switch (d.kind) {
    case Kind::Allreduce:
      out.inputs.push_back(filled(d.dtype, {d.cols}, r, j, 0));
      out.handle = allreduce_async(out.inputs[0], d.name, options);
      break;
    case Kind::AllreduceOutOfPlace:
      out.inputs.push_back(filled(d.dtype, {d.cols}, r, j, 0));
      out.output = Tensor(d.dtype, {d.cols});
      out.handle = allreduce_async(out.inputs[0], out.output, d.name, options);
      break;
    case Kind::GroupedAllreduce: {
      std::vector<TensorView> views;
      for (int t = 0; t < kGroup; ++t) {
        out.inputs.push_back(filled(d.dtype, {d.cols + t}, r, j, t));
        views.push_back(out.inputs.back());
      }
      out.handle = grouped_allreduce_async(views, d.name, options);
      break;
    }
    case Kind::Allgather:
      out.inputs.push_back(filled(d.dtype, {gathered_rows(q, j, 0, s), d.cols}, r, j, 0));
      out.handle = allgather_async(out.inputs[0], d.name, set);
      break;
    case Kind::GroupedAllgather: {
      std::vector<TensorView> views;
      for (int t = 0; t < kGroup; ++t) {
        out.inputs.push_back(filled(d.dtype, {gathered_rows(q, j, t, s), d.cols}, r, j, t));
        views.push_back(out.inputs.back());
      }
      out.handle = grouped_allgather_async(views, d.name, set);
      break;
    }
    case Kind::Broadcast:  // Non-roots start from another op's values.
      out.inputs.push_back(filled(d.dtype, {d.cols}, r, r == d.root ? j : j + 1, 0));
      out.handle = broadcast_async(out.inputs[0], d.root, d.name, set);
      break;
    case Kind::Alltoall: {
      std::vector<std::int64_t> splits;
      for (int to = 0; to < n; ++to) splits.push_back(sent_rows(q, to, j, s));
      const std::int64_t rows = std::accumulate(splits.begin(), splits.end(), std::int64_t{0});
      out.inputs.push_back(filled(d.dtype, {rows, d.cols}, r, j, 0));
      out.handle = alltoall_async(out.inputs[0], splits, d.name, set);
      break;
    }
    case Kind::Reducescatter:
      out.inputs.push_back(filled(d.dtype, {d.rows, d.cols}, r, j, 0));
      out.handle = reducescatter_async(out.inputs[0], d.name, options);
      break;
    case Kind::Reduce:
      out.inputs.push_back(filled(d.dtype, {d.cols}, r, j, 0));
      out.handle = reduce_async(out.inputs[0], d.root, d.name, options);
      break;
    case Kind::Gather:
      out.inputs.push_back(filled(d.dtype, {gathered_rows(q, j, 0, s), d.cols}, r, j, 0));
      out.handle = gather_async(out.inputs[0], d.root, d.name, set);
      break;
    case Kind::Scatter: {
      std::vector<std::int64_t> splits;
      for (int to = 0; to < n; ++to) splits.push_back(sent_rows(0, to, j, s));
      const std::int64_t rows = std::accumulate(splits.begin(), splits.end(), std::int64_t{0});
      out.inputs.push_back(filled(d.dtype, {r == d.root ? rows : 0, d.cols}, r, j, 0));
      out.handle = scatter_async(out.inputs[0], d.root, splits, d.name, set);
      break;
    }
  }
  return out;
}

// The rows of op j's tensor t that each member contributes, concatenated in set-rank order.
std::vector<double> gathered(const Draw& d, const std::vector<int>& members, int j, int t, int s) {
  std::vector<double> all;
  for (std::size_t q = 0; q < members.size(); ++q)
    for (std::int64_t i = 0; i < gathered_rows(static_cast<int>(q), j, t, s) * d.cols; ++i)
      all.push_back(value(members[q], j, t, i));
  return all;
}

// Empty if this rank's results of draw j are right, else the first difference.
std::string verify(const Draw& d, const Submitted& got, const std::vector<int>& members, int j,
                   int s, int q) {
  const int r = world_rank();
  const int n = static_cast<int>(members.size());
  auto reduced_range = [&](std::int64_t first, std::int64_t count, int t) {
    std::vector<double> v;
    for (std::int64_t i = first; i < first + count; ++i) v.push_back(reduced(d, members, j, t, i));
    return v;
  };
  auto own = [&](std::int64_t count) {
    std::vector<double> v;
    for (std::int64_t i = 0; i < count; ++i) v.push_back(value(r, j, 0, i));
    return v;
  };
  switch (d.kind) {
    case Kind::Allreduce:
      return compare_values(values_of(got.inputs[0]), reduced_range(0, d.cols, 0), d.dtype);
    case Kind::AllreduceOutOfPlace: {
      std::string e = compare_values(values_of(got.output), reduced_range(0, d.cols, 0), d.dtype);
      return e.empty() ? compare_values(values_of(got.inputs[0]), own(d.cols), d.dtype) : e;
    }
    case Kind::GroupedAllreduce:
      for (int t = 0; t < kGroup; ++t) {
        std::string e = compare_values(values_of(got.inputs[static_cast<std::size_t>(t)]),
                                       reduced_range(0, d.cols + t, t), d.dtype);
        if (!e.empty()) return "tensor " + std::to_string(t) + ": " + e;
      }
      return "";
    case Kind::Allgather:
      return compare_values(values_of(got.handle.output()), gathered(d, members, j, 0, s), d.dtype);
    case Kind::GroupedAllgather:
      for (int t = 0; t < kGroup; ++t) {
        std::string e = compare_values(values_of(got.handle.outputs()[static_cast<std::size_t>(t)]),
                                       gathered(d, members, j, t, s), d.dtype);
        if (!e.empty()) return "tensor " + std::to_string(t) + ": " + e;
      }
      return "";
    case Kind::Broadcast: {
      std::vector<double> root;
      for (std::int64_t i = 0; i < d.cols; ++i) root.push_back(value(d.root, j, 0, i));
      return compare_values(values_of(got.inputs[0]), root, d.dtype);
    }
    case Kind::Alltoall: {
      std::vector<double> want;
      for (int from = 0; from < n; ++from) {
        std::int64_t before = 0;  // Rows `from` sends to the set ranks before this one.
        for (int to = 0; to < q; ++to) before += sent_rows(from, to, j, s);
        for (std::int64_t i = 0; i < sent_rows(from, q, j, s) * d.cols; ++i)
          want.push_back(value(members[static_cast<std::size_t>(from)], j, 0, before * d.cols + i));
        if (got.handle.received_splits()[static_cast<std::size_t>(from)] !=
            sent_rows(from, q, j, s))
          return "received_splits from set rank " + std::to_string(from);
      }
      return compare_values(values_of(got.handle.output()), want, d.dtype);
    }
    case Kind::Reducescatter: {  // API.md's split: q·(rows / n) + min(q, rows % n) ...
      const std::int64_t base = d.rows / n, extra = d.rows % n;
      const std::int64_t first = q * base + std::min<std::int64_t>(q, extra);
      const std::int64_t count = base + (q < extra ? 1 : 0);
      return compare_values(values_of(got.handle.output()),
                            reduced_range(first * d.cols, count * d.cols, 0), d.dtype);
    }
    case Kind::Reduce:  // Only the root's tensor changes.
      return compare_values(values_of(got.inputs[0]),
                            r == d.root ? reduced_range(0, d.cols, 0) : own(d.cols), d.dtype);
    case Kind::Gather:
      return compare_values(values_of(got.handle.output()),
                            r == d.root ? gathered(d, members, j, 0, s) : std::vector<double>{},
                            d.dtype);
    case Kind::Scatter: {
      std::int64_t before = 0;
      for (int to = 0; to < q; ++to) before += sent_rows(0, to, j, s);
      std::vector<double> want;
      for (std::int64_t i = 0; i < sent_rows(0, q, j, s) * d.cols; ++i)
        want.push_back(value(d.root, j, 0, before * d.cols + i));
      return compare_values(values_of(got.handle.output()), want, d.dtype);
    }
  }
  return "unknown kind";
}

// The test's process sets: the global set, and from 3 ranks two sets whose set ranks differ
// from the global ones.
struct Sets {
  std::vector<ProcessSet> sets = {ProcessSet::global()};
  std::vector<std::vector<int>> members;
  std::vector<int> set_rank;  // This rank's place in each set, -1 outside it.

  Sets() {
    const int size = world_size();
    members.resize(1);
    for (int r = 0; r < size; ++r) members[0].push_back(r);
    if (size >= 3) {
      members.push_back({0, size - 1});
      members.push_back(std::vector<int>(members[0].begin() + 1, members[0].end()));
      for (std::size_t k = 1; k < members.size(); ++k) sets.push_back(add_process_set(members[k]));
    }
    for (const std::vector<int>& set : members) {
      const auto at = std::find(set.begin(), set.end(), world_rank());
      set_rank.push_back(at == set.end() ? -1 : static_cast<int>(at - set.begin()));
    }
  }
};

// The draw of step s that one member submits with another dtype, or -1: from `first_step` on,
// every other step's first draw on a set of two or more members.
int mismatched_draw(const std::vector<Draw>& draws, const Sets& sets, int s, int first_step) {
  if (s < first_step || (s - first_step) % 2 != 0) return -1;
  for (std::size_t j = 0; j < draws.size(); ++j)
    if (sets.members[static_cast<std::size_t>(draws[j].set)].size() >= 2)
      return static_cast<int>(j);
  return -1;
}

// Runs `steps` steps. From `mismatch_from` on (never if negative), every other step has one
// draw that the last member of its set submits with another dtype: that op must fail with
// Mismatch on every member, naming the op and the dtypes, and the step's other ops complete as
// usual, before and after it (names recur, so the mismatched name is often a cached one, and
// later steps use it again with one dtype on every rank).
void run_stream(int steps, int mismatch_from, Failures& failures) {
  Sets sets;
  // Stops after the first step that failed on any rank (Note [Collective assertions]: a rank
  // that stopped alone would leave the others waiting for its next ops).
  for (int s = 0; s < steps && all_ranks(failures.ok()); ++s) {
    std::mt19937 g(static_cast<unsigned>(1000 + s));  // The same draws on every rank.
    std::vector<bool> names_taken(kKinds * kSets * kNames, false);
    std::vector<Draw> draws(1 + g() % kMaxDraws);
    for (Draw& d : draws) d = draw(g, sets.members, names_taken);
    const int odd = mismatch_from < 0 ? -1 : mismatched_draw(draws, sets, s, mismatch_from);
    std::vector<int> order(draws.size());
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 mine(static_cast<unsigned>(77 + 1000 * s + world_rank()));
    std::shuffle(order.begin(), order.end(), mine);
    std::vector<Submitted> submitted(draws.size());
    for (int j : order) {
      Draw d = draws[static_cast<std::size_t>(j)];
      const auto set = static_cast<std::size_t>(d.set);
      if (sets.set_rank[set] < 0) continue;
      // Another dtype: float64, which holds every value drawn exactly, or float32 for a float64 op.
      if (j == odd && world_rank() == sets.members[set].back())
        d.dtype = d.dtype == DataType::Float64 ? DataType::Float32 : DataType::Float64;
      submitted[static_cast<std::size_t>(j)] = submit(d, j, s, sets.sets[set], sets.set_rank[set],
                                                      static_cast<int>(sets.members[set].size()));
    }
    const std::string step = "step " + std::to_string(s) + ": ";
    for (std::size_t j = 0; j < draws.size(); ++j) {
      const Draw& d = draws[j];
      const auto set = static_cast<std::size_t>(d.set);
      if (sets.set_rank[set] < 0) continue;
      std::string error;
      const std::optional<ErrorCode> code = error_of([&] { submitted[j].handle.wait(); }, &error);
      if (static_cast<int>(j) == odd) {
        failures.check(code == ErrorCode::Mismatch && error.find(d.name) != std::string::npos &&
                           error.find("data types") != std::string::npos,
                       step + describe(d) + " submitted with two dtypes gave '" + error + "'");
        continue;
      }
      failures.check(!code.has_value(), step + describe(d) + ": " + error);
      if (code.has_value()) continue;
      failures.expect_equal(
          verify(d, submitted[j], sets.members[set], static_cast<int>(j), s, sets.set_rank[set]),
          step + describe(d));
    }
  }
}

}  // namespace

TEST_CASE("every kind of collective on several sets in one stream, in each rank's own order",
          "[mixed]") {
  Session session;
  Failures failures;
  run_stream(/*steps=*/24, /*mismatch_from=*/-1, failures);
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("an op of the stream submitted with two dtypes fails on every member, the rest completes",
          "[mixed][mismatch]") {
  if (world_size() < 2) return;  // No set has two members.
  Session session;
  Failures failures;
  // Four steps first, so that the mismatched names are mostly cached ones.
  run_stream(/*steps=*/16, /*mismatch_from=*/4, failures);
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

}  // namespace tutti::test
