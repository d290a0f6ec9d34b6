// SPDX-License-Identifier: Apache-2.0
// allreduce against plain MPI: every dtype x op x shape, async batches in rank-dependent
// order, scale factors, grouped and out-of-place forms. Values are small integers, so every
// summation order gives the same result and the oracle compares exactly (up to the final
// scaling, compared with a tolerance).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/core/oracle.h"
#include "test/support/capture_stderr.h"
#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

const std::vector<Shape> kShapes = {{}, {0}, {1}, {17, 3}, {1023}, {1025}, {3, 0, 2}, {4096}};

TEST_CASE("allreduce matches plain MPI for every dtype, op and shape", "[allreduce]") {
  Session session;
  const std::string failure = sweep_against_oracle(kShapes, "sweep");
  INFO(failure);
  CHECK(all_ranks(failure.empty()));
}

TEST_CASE("prescale and postscale apply before and after the reduction", "[allreduce]") {
  Session session;
  const int size = world_size();
  bool all_ok = true;
  std::string failure;
  for (DataType dtype : {DataType::Float32, DataType::Float64, DataType::Float16,
                         DataType::BFloat16, DataType::Int32, DataType::Int64, DataType::UInt8}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
      HostTensor t(dtype, {33}, world_rank(), false);
      const std::vector<double> expected = oracle_allreduce(t, op, 0.5, 3.0, size);
      tutti::allreduce(t.view(), "scaled",
                       {.op = op, .prescale_factor = 0.5, .postscale_factor = 3.0});
      const std::string f = t.compare(expected);
      if (!f.empty() && failure.empty()) failure = std::string(to_string(dtype)) + ": " + f;
      all_ok = all_ok && f.empty();
    }
  }
  INFO(failure);
  CHECK(all_ranks(all_ok));
}

// The integer rule (API.md, collectives.h): trunc(postscale · Σ(prescale · x)) computed in
// double, truncated toward zero once and saturated to the dtype's range; the expected values
// are closed forms in the set size.
TEST_CASE("integer scalings truncate toward zero and saturate to the dtype's range",
          "[allreduce]") {
  Session session;
  const int n = world_size();
  constexpr std::int64_t kCount = 37;  // Odd: past any vector loop's whole blocks.
  auto equal_all = [](const auto& values, auto expected) {
    return std::all_of(values.begin(), values.end(), [&](auto v) { return v == expected; });
  };
  // Prescale past both ends of int8, then Min/Max: every rank's scaled value is a limit.
  std::vector<std::int8_t> high(kCount, static_cast<std::int8_t>(1 + world_rank() % 3));
  allreduce(TensorView(high.data(), {kCount}), "sat.high",
            {.op = ReduceOp::Min, .prescale_factor = 1000.0});
  std::vector<std::int8_t> low(kCount, static_cast<std::int8_t>(1 + world_rank() % 3));
  allreduce(TensorView(low.data(), {kCount}), "sat.low",
            {.op = ReduceOp::Max, .prescale_factor = -1000.0});
  // Postscale of a sum in range: 100 * n saturates at 127 from n = 2; -n into uint8 is 0; n
  // times 1e10 past int32's maximum.
  std::vector<std::int8_t> post(kCount, 1);
  allreduce(TensorView(post.data(), {kCount}), "sat.post",
            {.op = ReduceOp::Sum, .postscale_factor = 100.0});
  std::vector<std::uint8_t> negative(kCount, 1);
  allreduce(TensorView(negative.data(), {kCount}), "sat.negative",
            {.op = ReduceOp::Sum, .postscale_factor = -1.0});
  std::vector<std::int32_t> huge(kCount, 1);
  allreduce(TensorView(huge.data(), {kCount}), "sat.huge",
            {.op = ReduceOp::Sum, .postscale_factor = 1e10});
  // Truncation toward zero: -n * 0.4 is -0.4, -0.8, -1.2, -1.6 at 1-4 ranks: 0, 0, -1, -1.
  std::vector<std::int32_t> truncated(kCount, -1);
  allreduce(TensorView(truncated.data(), {kCount}), "sat.truncated",
            {.op = ReduceOp::Sum, .postscale_factor = 0.4});
  CHECK(all_ranks(equal_all(high, std::int8_t{127})));
  CHECK(all_ranks(equal_all(low, std::int8_t{-128})));
  CHECK(all_ranks(equal_all(post, static_cast<std::int8_t>(std::min(100 * n, 127)))));
  CHECK(all_ranks(equal_all(negative, std::uint8_t{0})));
  CHECK(all_ranks(equal_all(huge, std::numeric_limits<std::int32_t>::max())));
  CHECK(all_ranks(equal_all(truncated, static_cast<std::int32_t>(std::trunc(-0.4 * n)))));
  // Nothing in between is integer arithmetic: the sum of int8 100s is 100 n before the 0.5
  // (an int8 sum would wrap from 2 ranks), and 13 · 1.5 = 19.5 is not truncated before the sum
  // (which would give 19 n).
  std::vector<std::int8_t> wide(kCount, 100);
  allreduce(TensorView(wide.data(), {kCount}), "sat.wide",
            {.op = ReduceOp::Sum, .postscale_factor = 0.5});
  std::vector<std::int32_t> fraction(kCount, 13);
  allreduce(TensorView(fraction.data(), {kCount}), "sat.fraction",
            {.op = ReduceOp::Sum, .prescale_factor = 1.5});
  CHECK(all_ranks(equal_all(wide, static_cast<std::int8_t>(std::min(50 * n, 127)))));
  CHECK(all_ranks(equal_all(fraction, static_cast<std::int32_t>(std::trunc(19.5 * n)))));
}

TEST_CASE("a batch of mixed tensors submitted in a different order on each rank", "[allreduce]") {
  Session session;
  const int size = world_size();
  constexpr int kCount = 300;
  std::vector<HostTensor> tensors;
  std::vector<std::vector<double>> expected;
  for (int i = 0; i < kCount; ++i) {
    const DataType dtype = kAllDtypes[static_cast<std::size_t>(i) % 10];  // Every numeric type.
    const Shape shape = {static_cast<std::int64_t>((i * 37) % 700)};
    tensors.emplace_back(dtype, shape, world_rank() + i, false);
    expected.push_back(oracle_allreduce(tensors.back(), ReduceOp::Sum, 1.0, 1.0, size));
  }
  std::vector<int> order(kCount);
  for (int i = 0; i < kCount; ++i) order[i] = i;
  std::mt19937 shuffle(static_cast<unsigned>(1234 + world_rank()));
  std::shuffle(order.begin(), order.end(), shuffle);
  std::vector<Handle> handles(kCount);
  for (int i : order) {
    handles[i] =
        allreduce_async(tensors[i].view(), "batch." + std::to_string(i), {.op = ReduceOp::Sum});
  }
  bool all_ok = true;
  for (int i = 0; i < kCount; ++i) {
    handles[i].wait();
    all_ok = all_ok && tensors[i].compare(expected[i]).empty();
  }
  CHECK(all_ranks(all_ok));
}

TEST_CASE("a long burst submitted in opposite orders on even and odd ranks", "[allreduce]") {
  // Past the submission window (Note [A submitting thread keeps its backlog short]): where a
  // rank shares its core with its communication thread, every 256th push waits (at most
  // 200 us) for the op pushed 512 before, which here a peer submits last. The burst must still
  // complete, each op with its closed-form sum.
  Session session;
  const int size = world_size();
  const int rank = world_rank();
  constexpr int kCount = 3000;
  std::vector<std::int64_t> values(kCount);
  std::vector<Handle> handles(kCount);
  for (int k = 0; k < kCount; ++k) {
    const int i = rank % 2 == 0 ? k : kCount - 1 - k;
    values[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(i) * (rank + 1);
    handles[static_cast<std::size_t>(i)] =
        allreduce_async(TensorView(&values[static_cast<std::size_t>(i)], {1}),
                        "burst." + std::to_string(i), {.op = ReduceOp::Sum});
  }
  bool all_ok = true;
  for (int i = 0; i < kCount; ++i) {
    handles[static_cast<std::size_t>(i)].wait();
    // Sum over ranks r of i * (r + 1) = i * size * (size + 1) / 2.
    all_ok = all_ok && values[static_cast<std::size_t>(i)] ==
                           static_cast<std::int64_t>(i) * size * (size + 1) / 2;
  }
  CHECK(all_ranks(all_ok));
}

// Note [Lookup by the next id]: steps in the order of the ids (the expected id answers), then
// reversed (the lookups go by name), then in order again, then with one op's shape changed in
// the middle (the expected id holds another request: it must not answer, and the ops after the
// renegotiated one are in order again). Every op has its closed-form sum in every step.
TEST_CASE("cache hits in order, reversed, in order again, and past a changed op stay correct",
          "[allreduce]") {
  Session session;
  const int size = world_size();
  const int rank = world_rank();
  constexpr int kCount = 600;  // Past the submission window's chunk of 256.
  enum class Order { Forward, Reversed };
  bool all_ok = true;
  const auto step = [&](int s, Order order, int widened) {
    // Op i has 2 elements in the step that widens it (widened == i), else 1.
    std::vector<std::vector<std::int64_t>> values(kCount);
    std::vector<Handle> handles(kCount);
    for (int k = 0; k < kCount; ++k) {
      const int i = order == Order::Forward ? k : kCount - 1 - k;
      const std::int64_t n = i == widened ? 2 : 1;
      std::vector<std::int64_t>& v = values[static_cast<std::size_t>(i)];
      v.assign(static_cast<std::size_t>(n),
               static_cast<std::int64_t>(i + 1) * (s + 1) * (rank + 1));
      handles[static_cast<std::size_t>(i)] = allreduce_async(
          TensorView(v.data(), {n}), "ordered." + std::to_string(i), {.op = ReduceOp::Sum});
    }
    for (int i = 0; i < kCount; ++i) {
      handles[static_cast<std::size_t>(i)].wait();
      // Sum over ranks r of (i + 1)(s + 1)(r + 1).
      const std::int64_t expected =
          static_cast<std::int64_t>(i + 1) * (s + 1) * size * (size + 1) / 2;
      for (std::int64_t x : values[static_cast<std::size_t>(i)]) all_ok = all_ok && x == expected;
    }
  };
  step(0, Order::Forward, -1);  // Negotiated: the ids follow this order.
  step(1, Order::Forward, -1);
  step(2, Order::Reversed, -1);
  step(3, Order::Forward, -1);
  step(4, Order::Forward, kCount / 2);
  step(5, Order::Forward, kCount / 2);  // The widened op's new id, out of the others' order.
  step(6, Order::Forward, -1);          // Back to one element: its third request.
  CHECK(all_ranks(all_ok));
}

// Note [Cache growth]: a step of more op names than the default cache holds (1,024). With
// TUTTI_CACHE_CAPACITY unset, the cache grows once the names have come back often enough (rank 0
// logs it at INFO); set (the "small-cache" run's 4 entries), it keeps its capacity, keeps the
// names it cannot hold out and warns once. Either way every op has its closed-form sum in every
// step.
TEST_CASE("more recurring op names than the cache holds stay correct while it grows",
          "[allreduce][cache]") {
  const bool capacity_set = std::getenv("TUTTI_CACHE_CAPACITY") != nullptr;
  const char* level = std::getenv("TUTTI_LOG_LEVEL");
  const std::string saved_level = level != nullptr ? level : "";
  ::setenv("TUTTI_LOG_LEVEL", "INFO", 1);
  CaptureStderr capture;
  const int size = world_size();
  const int rank = world_rank();
  constexpr int kCount = 1500;
  bool all_ok = true;
  {
    Session session;
    std::vector<std::int64_t> values(kCount);
    std::vector<Handle> handles(kCount);
    // The 476 names the first step evicts come back once a step: the 1,024th recurrence, which
    // makes the report due, is in the fourth step.
    for (int s = 0; s < 6; ++s) {
      for (int i = 0; i < kCount; ++i) {
        values[static_cast<std::size_t>(i)] =
            static_cast<std::int64_t>(i + 1) * (s + 1) * (rank + 1);
        handles[static_cast<std::size_t>(i)] =
            allreduce_async(TensorView(&values[static_cast<std::size_t>(i)], {1}),
                            "growing." + std::to_string(i), {.op = ReduceOp::Sum});
      }
      for (int i = 0; i < kCount; ++i) {
        handles[static_cast<std::size_t>(i)].wait();
        // Sum over ranks r of (i + 1)(s + 1)(r + 1).
        all_ok = all_ok && values[static_cast<std::size_t>(i)] ==
                               static_cast<std::int64_t>(i + 1) * (s + 1) * size * (size + 1) / 2;
      }
    }
  }
  const std::string log = capture.text();
  if (saved_level.empty()) {
    ::unsetenv("TUTTI_LOG_LEVEL");
  } else {
    ::setenv("TUTTI_LOG_LEVEL", saved_level.c_str(), 1);
  }
  CHECK(all_ranks(all_ok));
  if (rank == 0) {
    INFO(log);
    if (capacity_set) {
      CHECK(count_occurrences(log, "the response cache is too small") == 1);
      CHECK(count_occurrences(log, "the response cache grew") == 0);
    } else {
      CHECK(count_occurrences(log, "the response cache grew from 1024 to ") == 1);
      CHECK(count_occurrences(log, "the response cache is too small") == 0);
    }
  }
}

TEST_CASE("grouped allreduce of mixed dtypes completes as one unit", "[allreduce]") {
  Session session;
  const int size = world_size();
  HostTensor a(DataType::Float32, {5, 4}, world_rank(), false);
  HostTensor b(DataType::Int64, {7}, world_rank(), false);
  HostTensor c(DataType::BFloat16, {3}, world_rank(), false);
  const auto ea = oracle_allreduce(a, ReduceOp::Average, 1, 1, size);
  const auto eb = oracle_allreduce(b, ReduceOp::Average, 1, 1, size);
  const auto ec = oracle_allreduce(c, ReduceOp::Average, 1, 1, size);
  Handle h = grouped_allreduce_async({a.view(), b.view(), c.view()}, "group");
  h.wait();
  CHECK(all_ranks(a.compare(ea).empty() && b.compare(eb).empty() && c.compare(ec).empty()));
}

TEST_CASE("a grouped int64 beside float32 is exact beyond 2^53, as alone", "[allreduce]") {
  // API.md: unscaled integers are exact in their own type. The group's float32 tensor makes the
  // batch mixed; it once travelled whole as float64, which rounds 2^53 + 1 to 2^53.
  Session session;
  constexpr std::int64_t kBig = (std::int64_t{1} << 53) + 1;
  const std::int64_t r = world_rank();
  std::vector<std::int64_t> big = {kBig + r, -kBig - 3 * r, kBig * 64 + 1};
  std::vector<float> small = {0.5f + static_cast<float>(r), -1.0f};
  std::vector<std::int64_t> want(big.size());
  MPI_Allreduce(big.data(), want.data(), static_cast<int>(big.size()), MPI_INT64_T, MPI_SUM,
                MPI_COMM_WORLD);
  const float n = static_cast<float>(world_size());
  grouped_allreduce({TensorView(small.data(), {2}), TensorView(big.data(), {3})}, "int64.exact",
                    {.op = ReduceOp::Sum});
  CHECK(all_ranks(big == want));
  CHECK(all_ranks(small[0] == 0.5f * n + (n - 1) * n / 2 && small[1] == -n));
}

TEST_CASE("a grouped allreduce of overlapping tensors is InvalidArgument; nothing runs",
          "[allreduce]") {
  // Every tensor of the group is written: before, one tensor listed twice was summed twice or
  // not, by size (Sum of ones at 2 ranks: 2 for 4 elements, 4 for 1,000,000). Every rank passes
  // the same list here, so every rank's call refuses it.
  Session session;
  bool ok = true;
  std::string messages;
  for (const std::int64_t n : {std::int64_t{4}, std::int64_t{1000000}}) {
    std::vector<float> v(static_cast<std::size_t>(n) + 8, 1.0f);
    const std::vector<std::vector<TensorView>> groups = {
        {TensorView(v.data(), {n}), TensorView(v.data(), {n})},      // The same twice.
        {TensorView(v.data() + 8, {n}), TensorView(v.data(), {9})},  // Views that overlap.
        {TensorView(v.data(), {n}), TensorView(v.data() + 8, {0}),   // Empty: never overlaps;
         TensorView(v.data() + 2, {1})},                             // [2] inside [0].
    };
    for (const std::vector<TensorView>& group : groups) {
      std::string message;
      ok = ok && error_of([&] { grouped_allreduce(group, "overlap", {.op = ReduceOp::Sum}); },
                          &message) == ErrorCode::InvalidArgument;
      ok = ok && message.find("overlap[0]") != std::string::npos;
      messages += message + "\n";
    }
    ok = ok && std::all_of(v.begin(), v.end(), [](float x) { return x == 1.0f; });
    // Adjacent views and an empty view at a tensor's address are separate memory: reduced.
    grouped_allreduce(
        {TensorView(v.data(), {4}), TensorView(v.data() + 4, {4}), TensorView(v.data() + 4, {0})},
        "adjacent", {.op = ReduceOp::Sum});
    ok = ok && std::all_of(v.begin(), v.begin() + 8,
                           [](float x) { return x == static_cast<float>(world_size()); });
    ok = ok && v[8] == 1.0f;
  }
  INFO(messages);
  CHECK(all_ranks(ok));
}

TEST_CASE("out-of-place allreduce leaves the input alone", "[allreduce]") {
  Session session;
  const int size = world_size();
  for (std::int64_t n : {1, 1000, 300000}) {
    HostTensor in(DataType::Float32, {n}, world_rank(), false);
    HostTensor out(DataType::Float32, {n}, 99, false);
    const std::vector<double> before = in.values();
    const auto expected = oracle_allreduce(in, ReduceOp::Sum, 2.0, 1.0, size);
    allreduce_async(in.view(), out.view(), "oop", {.op = ReduceOp::Sum, .prescale_factor = 2.0})
        .wait();
    CHECK(all_ranks(out.compare(expected).empty() && in.values() == before));
  }
}

TEST_CASE("the same name can be reused once the op is done, with another shape", "[allreduce]") {
  Session session;
  bool ok = true;
  for (std::int64_t n : {3, 9, 1}) {
    std::vector<float> v(static_cast<std::size_t>(n), 1.0f);
    allreduce(TensorView(v.data(), {n}), "reused", {.op = ReduceOp::Sum});
    ok = ok && std::all_of(v.begin(), v.end(),
                           [](float x) { return x == static_cast<float>(world_size()); });
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("unnamed ops match by submission order", "[allreduce]") {
  Session session;
  std::vector<int> a(4, 1), b(2, 10);
  Handle ha = allreduce_async(TensorView(a.data(), {4}), {}, {.op = ReduceOp::Sum});
  Handle hb = allreduce_async(TensorView(b.data(), {2}), {}, {.op = ReduceOp::Sum});
  ha.wait();
  hb.wait();
  CHECK(all_ranks(a[3] == world_size() && b[1] == 10 * world_size()));
}

}  // namespace
}  // namespace tutti::test
