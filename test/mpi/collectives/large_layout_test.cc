// SPDX-License-Identifier: Apache-2.0
// The piecewise paths every collective takes past MPI's int counts (2^31 elements; issue 11:
// int8 allgather of 2^31+17 elements per rank aborted the job), exercised at small sizes by
// lowering the piece size to 7 elements: allgather with uneven rows, alltoall with uneven
// splits, reducescatter, Adasum, allreduce, broadcast, and the rooted reduce, gather and
// scatter, each against a closed form. The real
// sizes need ~13 GB per job, too much for CI: an int8 allgather of 2^31+17 elements per rank at
// 2 ranks was checked by hand once (README "Collectives and errors").
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/mpi/mpi_types.h"
#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

// A session whose MPI calls carry at most 7 elements each; set while no collective runs. Its
// host collectives run on MPI: shared memory (the default on one host) has no int counts, and
// would bypass the piecewise paths under test.
struct SmallPieces {
  SmallPieces() {
    ops::mpi::set_max_mpi_count_for_testing(7);
    setenv("TUTTI_HOST_TRANSPORT", "mpi", 1);
    tutti::init();
  }
  ~SmallPieces() {
    tutti::shutdown();
    unsetenv("TUTTI_HOST_TRANSPORT");
    ops::mpi::set_max_mpi_count_for_testing(0);
  }
};

TEST_CASE("allgather of uneven rows in pieces", "[large]") {
  SmallPieces pieces;
  const int n = size();
  const int r = rank();
  // Rank s gives s + 2 rows of 3 values 1000 s + i.
  std::vector<std::int32_t> input(static_cast<std::size_t>((r + 2) * 3));
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = 1000 * r + static_cast<int>(i);
  const Tensor out = allgather(TensorView(input.data(), {r + 2, 3}), "large.allgather");
  std::vector<std::int32_t> expected;
  for (int s = 0; s < n; ++s)
    for (int i = 0; i < (s + 2) * 3; ++i) expected.push_back(1000 * s + i);
  const std::span<const std::int32_t> got = out.span<std::int32_t>();
  CHECK(all_ranks(std::vector<std::int32_t>(got.begin(), got.end()) == expected));
}

TEST_CASE("alltoall of uneven splits in pieces", "[large]") {
  SmallPieces pieces;
  const int n = size();
  const int r = rank();
  // Rank s sends s + d + 1 rows of 2 values (100 s + d, i) to rank d.
  std::vector<std::int64_t> splits;
  std::vector<double> input;
  for (int d = 0; d < n; ++d) {
    splits.push_back(r + d + 1);
    for (int i = 0; i < 2 * (r + d + 1); ++i) input.push_back(100.0 * r + d + i / 1000.0);
  }
  const std::int64_t rows = static_cast<std::int64_t>(input.size()) / 2;
  const AlltoallResult result =
      alltoall(TensorView(input.data(), {rows, 2}), splits, "large.alltoall");
  std::vector<double> expected;
  std::vector<std::int64_t> expected_splits;
  for (int s = 0; s < n; ++s) {
    expected_splits.push_back(s + r + 1);
    for (int i = 0; i < 2 * (s + r + 1); ++i) expected.push_back(100.0 * s + r + i / 1000.0);
  }
  const std::span<const double> got = result.output.span<double>();
  CHECK(all_ranks(std::vector<double>(got.begin(), got.end()) == expected));
  CHECK(all_ranks(result.received_splits == expected_splits));
}

TEST_CASE("reducescatter in pieces", "[large]") {
  SmallPieces pieces;
  const int n = size();
  const int r = rank();
  // 5 n + 2 rows of 4 values (r + 1)(i + 1): the sum over ranks is n (n + 1) / 2 (i + 1).
  const std::int64_t rows = 5 * n + 2;
  std::vector<float> input(static_cast<std::size_t>(rows * 4));
  for (std::size_t i = 0; i < input.size(); ++i)
    input[i] = static_cast<float>((r + 1) * static_cast<int>(i + 1));
  const Tensor out =
      reducescatter(TensorView(input.data(), {rows, 4}), "large.rs", {.op = ReduceOp::Sum});
  // Rank r gets rows [r q + min(r, m), ...), q = rows / n, m = rows % n.
  const std::int64_t q = rows / n;
  const std::int64_t m = rows % n;
  const std::int64_t first = r * q + std::min<std::int64_t>(r, m);
  const std::int64_t mine = q + (r < m ? 1 : 0);
  std::vector<float> expected;
  for (std::int64_t i = first * 4; i < (first + mine) * 4; ++i)
    expected.push_back(static_cast<float>(n * (n + 1) / 2 * (i + 1)));
  const std::span<const float> got = out.span<float>();
  CHECK(all_ranks(std::vector<float>(got.begin(), got.end()) == expected));
}

TEST_CASE("adasum, allreduce and broadcast in pieces", "[large]") {
  SmallPieces pieces;
  const int n = size();
  const int r = rank();
  constexpr int kCount = 61;
  // Pairwise orthogonal vectors (rank r is non-zero only where i % n == r): Adasum of
  // orthogonal vectors is their sum.
  if ((n & (n - 1)) == 0) {
    std::vector<double> v(kCount, 0.0);
    for (int i = r; i < kCount; i += n) v[static_cast<std::size_t>(i)] = i + 1.0;
    allreduce(TensorView(v.data(), {kCount}), "large.adasum", {.op = ReduceOp::Adasum});
    bool ok = true;
    for (int i = 0; i < kCount; ++i)
      ok = ok && std::abs(v[static_cast<std::size_t>(i)] - (i + 1.0)) < 1e-9;
    CHECK(all_ranks(ok));
  }
  std::vector<std::int64_t> sum(kCount, r + 1);
  allreduce(TensorView(sum.data(), {kCount}), "large.sum", {.op = ReduceOp::Sum});
  CHECK(all_ranks(sum == std::vector<std::int64_t>(kCount, n * (n + 1) / 2)));
  std::vector<std::int16_t> b(kCount, static_cast<std::int16_t>(r == n - 1 ? 7 : -1));
  broadcast(TensorView(b.data(), {kCount}), n - 1, "large.broadcast");
  CHECK(all_ranks(b == std::vector<std::int16_t>(kCount, 7)));
}

TEST_CASE("reduce, gather and scatter in pieces, at every root", "[large][rooted]") {
  SmallPieces pieces;
  const int n = size();
  const int r = rank();
  constexpr int kCount = 61;
  for (int root = 0; root < n; ++root) {
    // reduce: rank s holds s + 1 (in place on the root; read elsewhere) and, fused with it, a
    // float32 tensor of s + 2 (both unchanged off the root).
    std::vector<std::int64_t> sum(kCount, r + 1);
    std::vector<float> other(kCount, r + 2.0f);
    Handle a =
        reduce_async(TensorView(sum.data(), {kCount}), root, "large.reduce", {.op = ReduceOp::Sum});
    Handle b = reduce_async(TensorView(other.data(), {kCount}), root, "large.reduce.f",
                            {.op = ReduceOp::Sum});
    a.wait();
    b.wait();
    const bool is_root = r == root;
    CHECK(all_ranks(sum == std::vector<std::int64_t>(kCount, is_root ? n * (n + 1) / 2 : r + 1) &&
                    other == std::vector<float>(kCount, is_root ? n * (n + 3) / 2.0f : r + 2.0f)));
    // gather: rank s gives s + 2 rows of 3 values 1000 s + i.
    std::vector<std::int32_t> input(static_cast<std::size_t>((r + 2) * 3));
    for (std::size_t i = 0; i < input.size(); ++i) input[i] = 1000 * r + static_cast<int>(i);
    const Tensor out = gather(TensorView(input.data(), {r + 2, 3}), root, "large.gather");
    std::vector<std::int32_t> expected;
    for (int s = 0; s < n && is_root; ++s)
      for (int i = 0; i < (s + 2) * 3; ++i) expected.push_back(1000 * s + i);
    std::vector<std::int32_t> got;
    if (is_root) got.assign(out.span<std::int32_t>().begin(), out.span<std::int32_t>().end());
    CHECK(all_ranks(got == expected && (is_root || out.data() == nullptr)));
    // scatter: the same rows back from the root, s + 2 of them to rank s.
    std::vector<std::int32_t> all;
    std::vector<std::int64_t> splits;
    for (int s = 0; s < n; ++s) {
      splits.push_back(s + 2);
      for (int i = 0; i < (s + 2) * 3 && is_root; ++i) all.push_back(1000 * s + i);
    }
    const std::int64_t rows = static_cast<std::int64_t>(n) * (n + 3) / 2;
    const Tensor part = scatter(
        is_root ? TensorView(all.data(), {rows, 3}) : TensorView(nullptr, DataType::Int32, {0}),
        root, splits, "large.scatter");
    const std::span<const std::int32_t> mine = part.span<std::int32_t>();
    CHECK(all_ranks(std::vector<std::int32_t>(mine.begin(), mine.end()) == input));
  }
}

}  // namespace
}  // namespace tutti::test
