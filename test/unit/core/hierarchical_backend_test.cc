// SPDX-License-Identifier: Apache-2.0
// The hierarchical backend's schedules over in-memory backends (threads as ranks, no MPI),
// on contiguous and interleaved host layouts, against closed forms.
#include "ops/hierarchical/hierarchical_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/hierarchical/calibration.h"
#include "ops/hierarchical/host_layout.h"
#include "test/support/fake_transport.h"

namespace tutti::test {
namespace {

using ops::hierarchical::HierarchicalBackend;
using ops::hierarchical::HostLayout;
using ops::hierarchical::kCalibrationBytes;
using ops::hierarchical::kCalibrationMargin;
using ops::hierarchical::layout_from_host_ids;
using ops::hierarchical::settle_thresholds;
using ops::hierarchical::split_evenly;
using ops::hierarchical::threshold_from;

TEST_CASE("Host layouts number hosts by their lowest rank", "[hierarchical]") {
  const std::vector<int> contiguous_ids = {7, 7, 3, 3};
  const HostLayout contiguous = layout_from_host_ids(contiguous_ids);
  CHECK(contiguous.host_of == std::vector<int>{0, 0, 1, 1});
  CHECK(contiguous.local_index_of == std::vector<int>{0, 1, 0, 1});
  CHECK(contiguous.contiguous());
  CHECK(contiguous.hierarchical());

  const std::vector<int> interleaved_ids = {4, 9, 4, 9, 4, 9};
  const HostLayout interleaved = layout_from_host_ids(interleaved_ids);
  CHECK(interleaved.members == std::vector<std::vector<int>>{{0, 2, 4}, {1, 3, 5}});
  CHECK(interleaved.local_index_of == std::vector<int>{0, 0, 1, 1, 2, 2});
  CHECK_FALSE(interleaved.contiguous());
  CHECK(interleaved.hierarchical());

  const std::vector<int> three_plus_one = {0, 0, 0, 3};
  CHECK_FALSE(layout_from_host_ids(three_plus_one).uniform());
  CHECK_FALSE(layout_from_host_ids(three_plus_one).hierarchical());
  const std::vector<int> one_host = {0, 0, 0};
  CHECK_FALSE(layout_from_host_ids(one_host).hierarchical());
  const std::vector<int> one_per_host = {0, 1, 2};
  CHECK_FALSE(layout_from_host_ids(one_per_host).hierarchical());
}

TEST_CASE("split_evenly gives the first count % parts slices one more", "[hierarchical]") {
  CHECK(split_evenly(10, 3) == std::vector<std::size_t>{4, 3, 3});
  // Element by element: GCC 12.2's SLP vectorizer, tuning for Ice Lake class CPUs (this
  // project's -march=native on such a Xeon), builds the literal {1, 1, 0, 0} as {1, 1, 1, 1}.
  const std::vector<std::size_t> two_in_four = split_evenly(2, 4);
  REQUIRE(two_in_four.size() == 4);
  CHECK((two_in_four[0] == 1 && two_in_four[1] == 1 && two_in_four[2] == 0 && two_in_four[3] == 0));
  CHECK(split_evenly(0, 2) == std::vector<std::size_t>{0, 0});
}

// Runs `body(backend, rank)` on one thread per rank of `host_ids`' layout, each rank with a
// hierarchical backend over in-memory flat, intra-host and cross-host backends, hierarchical
// at every size.
template <class F>
void with_backends(const std::vector<int>& host_ids, F&& body) {
  const HostLayout layout = layout_from_host_ids(host_ids);
  const int size = layout.size();
  FakeWorld world(size);
  std::vector<std::unique_ptr<ops::Transport>> transports;
  for (int r = 0; r < size; ++r) transports.push_back(world.transport(r));
  std::vector<int> everyone;
  for (int r = 0; r < size; ++r) everyone.push_back(r);
  run_ranks(size, [&](int rank) {
    ops::Transport& transport = *transports[static_cast<std::size_t>(rank)];
    const auto me = static_cast<std::size_t>(rank);
    std::vector<int> same_index;  // One per host, in host order.
    for (const std::vector<int>& host : layout.members)
      same_index.push_back(host[static_cast<std::size_t>(layout.local_index_of[me])]);
    HierarchicalBackend::Parts parts{
        .flat = transport.create_backend(everyone, {}).value(),
        .local =
            transport
                .create_backend(layout.members[static_cast<std::size_t>(layout.host_of[me])], {})
                .value(),
        .cross = transport.create_backend(same_index, {}).value()};
    HierarchicalBackend backend(std::move(parts), layout,
                                {.allreduce_bytes = 0, .allgather_bytes = 0});
    body(backend, rank);
  });
}

const std::vector<std::vector<int>> kLayouts = {
    {0, 0, 1, 1},        // 2 hosts x 2, consecutive ranks.
    {0, 1, 0, 1},        // 2 hosts x 2, interleaved.
    {0, 0, 0, 3, 3, 3},  // 2 hosts x 3.
    {0, 0, 2, 2, 4, 4},  // 3 hosts x 2.
};

// Rank r's element i: small integers, exact in every dtype and summation order.
double value(int rank, std::size_t i) { return rank + 1 + static_cast<double>(i % 7); }

TEST_CASE("Hierarchical allreduce equals the closed form for every op", "[hierarchical]") {
  const std::vector<int> ids = GENERATE(from_range(kLayouts));
  const std::size_t count = GENERATE(0, 1, 2, 5, 1001);
  const ops::WireOp op =
      GENERATE(ops::WireOp::Sum, ops::WireOp::Min, ops::WireOp::Max, ops::WireOp::Product);
  const int size = static_cast<int>(ids.size());
  std::vector<std::vector<double>> results(ids.size());
  std::vector<int> ok(ids.size(), 0);
  with_backends(ids, [&](ops::Backend& backend, int rank) {
    std::vector<double> data(count);
    for (std::size_t i = 0; i < count; ++i) data[i] = value(rank, i);
    ok[static_cast<std::size_t>(rank)] =
        backend.allreduce(data.data(), count, DataType::Float64, op).ok();
    results[static_cast<std::size_t>(rank)] = data;
  });
  std::vector<double> expected(count);
  for (std::size_t i = 0; i < count; ++i) {
    double e = value(0, i);
    for (int r = 1; r < size; ++r) {
      const double x = value(r, i);
      e = op == ops::WireOp::Sum   ? e + x
          : op == ops::WireOp::Min ? std::min(e, x)
          : op == ops::WireOp::Max ? std::max(e, x)
                                   : e * x;
    }
    expected[i] = e;
  }
  CHECK(ok == std::vector<int>(ids.size(), 1));
  for (const std::vector<double>& result : results) CHECK(result == expected);
}

TEST_CASE("Hierarchical allreduce keeps integer and bool dtypes exact", "[hierarchical]") {
  const std::vector<int> ids = GENERATE(from_range(kLayouts));
  const std::size_t count = 13;
  std::vector<int> ok(ids.size(), 0);
  with_backends(ids, [&](ops::Backend& backend, int rank) {
    std::vector<std::int32_t> ints(count);
    std::vector<std::uint8_t> bools(count);
    for (std::size_t i = 0; i < count; ++i) {
      ints[i] = rank * 1000 + static_cast<std::int32_t>(i);
      bools[i] = static_cast<std::uint8_t>((rank + i) % 2);
    }
    std::vector<std::uint8_t> all_true = bools;
    const bool done =
        backend.allreduce(ints.data(), count, DataType::Int32, ops::WireOp::Sum).ok() &&
        backend.allreduce(bools.data(), count, DataType::Bool, ops::WireOp::Min).ok() &&
        backend.allreduce(all_true.data(), count, DataType::Bool, ops::WireOp::Max).ok();
    const auto n = static_cast<std::int32_t>(ids.size());
    bool right = done;
    for (std::size_t i = 0; i < count; ++i) {
      right = right && ints[i] == 1000 * n * (n - 1) / 2 + n * static_cast<std::int32_t>(i) &&
              bools[i] == 0 && all_true[i] == 1;
    }
    ok[static_cast<std::size_t>(rank)] = right;
  });
  CHECK(ok == std::vector<int>(ids.size(), 1));
}

TEST_CASE("Hierarchical allgatherv concatenates in set-rank order", "[hierarchical]") {
  const std::vector<int> ids = GENERATE(from_range(kLayouts));
  const std::size_t spread = GENERATE(0, 1, 3);  // Rank r sends (r * spread) % 4 elements.
  const int size = static_cast<int>(ids.size());
  std::vector<std::size_t> counts;
  std::vector<float> expected;
  for (int r = 0; r < size; ++r) {
    counts.push_back(static_cast<std::size_t>(r) * spread % 4);
    for (std::size_t j = 0; j < counts.back(); ++j) expected.push_back(100.0f * r + j);
  }
  std::vector<std::vector<float>> results(ids.size());
  std::vector<int> ok(ids.size(), 0);
  with_backends(ids, [&](ops::Backend& backend, int rank) {
    const auto me = static_cast<std::size_t>(rank);
    std::vector<float> input;
    for (std::size_t j = 0; j < counts[me]; ++j) input.push_back(100.0f * rank + j);
    std::vector<float> output(expected.size(), -1.0f);
    // A member without rows may pass no input at all, as a joined rank does.
    ok[me] = backend
                 .allgatherv(input.empty() ? nullptr : input.data(), output.data(), counts,
                             DataType::Float32)
                 .ok();
    results[me] = output;
  });
  CHECK(ok == std::vector<int>(ids.size(), 1));
  for (const std::vector<float>& result : results) CHECK(result == expected);
}

TEST_CASE("The automatic threshold: the smallest size hierarchical wins, flat winning none above",
          "[hierarchical][calibration]") {
  constexpr std::size_t kNever = HierarchicalBackend::kNever;
  using Times = std::vector<double>;
  // Clear wins take at most 90 % (kCalibrationMargin) of the other path's time.
  REQUIRE(kCalibrationMargin == 0.9);
  CHECK(threshold_from(Times{1, 10, 100}, Times{2, 5, 50}) == kCalibrationBytes[1]);
  CHECK(threshold_from(Times{1, 10, 100}, Times{0.5, 5, 50}) == kCalibrationBytes[0]);
  // Flat wins the middle size (10 <= 0.9 * 12): the hierarchy cannot reach below it.
  CHECK(threshold_from(Times{1, 10, 100}, Times{0.5, 12, 50}) == kCalibrationBytes[2]);
  CHECK(threshold_from(Times{1, 10, 100}, Times{0.5, 5, 120}) == kNever);  // Flat wins the largest.
  // Ties (neither path within 90 % of the other's time) join a clear win below them.
  CHECK(threshold_from(Times{1, 10, 100}, Times{0.5, 10.5, 105}) == kCalibrationBytes[0]);
  CHECK(threshold_from(Times{1, 10, 100}, Times{0.5, 5, 100}) == kCalibrationBytes[0]);
  CHECK(threshold_from(Times{1, 10, 100}, Times{1, 10, 97}) == kNever);  // Ties only.
  // A calibration on 2 x 2 namespaces (2026-11-30): wins at 16 and 256 KiB, a tie at 4 MiB.
  CHECK(threshold_from(Times{0.084, 0.296, 3.63}, Times{0.045, 0.26, 3.821}) ==
        kCalibrationBytes[0]);
  CHECK(threshold_from(Times{1, 10, 100}, Times{0.5, 5, std::nan("")}) == kNever);
  // The sizes a calibration plan measured, when they are not the defaults.
  CHECK(threshold_from(Times{1, 10, 100}, Times{2, 5, 50}, {256, 1024, 4096}) == 1024);
}

TEST_CASE("Thresholds follow the knobs, or measurements every member shares",
          "[hierarchical][calibration]") {
  const std::vector<int> ids = {0, 0, 1, 1};
  const ops::HierarchyMode mode =
      GENERATE(ops::HierarchyMode::Off, ops::HierarchyMode::On, ops::HierarchyMode::Auto);
  std::vector<HierarchicalBackend::Thresholds> settled(ids.size());
  std::vector<int> ok(ids.size(), 0);
  // Small sizes and one timed run: what is tested is that every member settles on the same
  // measured thresholds, which the default sizes (up to 4 MiB, five runs) took 31 s to show
  // under ThreadSanitizer.
  const ops::hierarchical::CalibrationPlan plan{.bytes = {256, 1024, 4096}, .runs = 1};
  with_backends(ids, [&](HierarchicalBackend& backend, int rank) {
    const auto me = static_cast<std::size_t>(rank);
    bool right =
        settle_thresholds(backend, {.allreduce = mode, .allgather = mode}, nullptr, plan).ok();
    settled[me] = backend.thresholds();
    // Whichever path each size takes now, the sums are right.
    for (std::size_t count : {std::size_t{3}, std::size_t{70000}}) {
      std::vector<float> data(count, static_cast<float>(rank + 1));
      right =
          right && backend.allreduce(data.data(), count, DataType::Float32, ops::WireOp::Sum).ok();
      right = right && std::all_of(data.begin(), data.end(), [](float x) { return x == 10.0f; });
    }
    ok[me] = right;
  });
  CHECK(ok == std::vector<int>(ids.size(), 1));
  const std::size_t expected = mode == ops::HierarchyMode::On ? 0 : HierarchicalBackend::kNever;
  for (const HierarchicalBackend::Thresholds& t : settled) {
    CHECK(t.allreduce_bytes == settled[0].allreduce_bytes);
    CHECK(t.allgather_bytes == settled[0].allgather_bytes);
    if (mode != ops::HierarchyMode::Auto) {
      CHECK(t.allreduce_bytes == expected);
      CHECK(t.allgather_bytes == expected);
    } else {
      const std::vector<std::size_t> possible = {plan.bytes[0], plan.bytes[1], plan.bytes[2],
                                                 HierarchicalBackend::kNever};
      CHECK(std::count(possible.begin(), possible.end(), t.allreduce_bytes) == 1);
      CHECK(std::count(possible.begin(), possible.end(), t.allgather_bytes) == 1);
    }
  }
}

}  // namespace
}  // namespace tutti::test
