// SPDX-License-Identifier: Apache-2.0
// reduce, gather and scatter at every root, against closed forms; the other ranks' tensors
// unchanged by reduce; root disagreements and bad roots.
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

TEST_CASE("reduce: only the root receives the result", "[rooted]") {
  Session session;
  const int n = size();
  const int r = rank();
  for (int root = 0; root < n; ++root) {
    // Rank s holds (s + 1)(i + 1): the sum is n (n + 1) / 2 (i + 1), the max n (i + 1).
    std::vector<double> sum(5), max(5);
    for (int i = 0; i < 5; ++i) sum[i] = max[i] = (r + 1.0) * (i + 1);
    const std::vector<double> mine = sum;
    reduce(TensorView(sum.data(), {5}), root, "rooted.sum", {.op = ReduceOp::Sum});
    reduce(TensorView(max.data(), {5}), root, "rooted.max", {.op = ReduceOp::Max});
    bool ok = true;
    for (int i = 0; i < 5; ++i) {
      if (r == root) {
        ok = ok && sum[i] == n * (n + 1) / 2.0 * (i + 1) && max[i] == n * (i + 1.0);
      } else {
        ok = ok && sum[i] == mine[i] && max[i] == mine[i];
      }
    }
    CHECK(all_ranks(ok));
  }
}

TEST_CASE("gather: the root gets every rank's rows in order, the others nothing", "[rooted]") {
  Session session;
  const int n = size();
  const int r = rank();
  for (int root = 0; root < n; ++root) {
    // Rank s gives s + 1 rows of 2 values 10 s + i.
    std::vector<std::int32_t> in(static_cast<std::size_t>(2 * (r + 1)));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = 10 * r + static_cast<int>(i);
    const Tensor out = gather(TensorView(in.data(), {r + 1, 2}), root, "rooted.gather");
    bool ok = true;
    if (r == root) {
      std::vector<std::int32_t> expected;
      for (int s = 0; s < n; ++s)
        for (int i = 0; i < 2 * (s + 1); ++i) expected.push_back(10 * s + i);
      const std::span<const std::int32_t> got = out.span<std::int32_t>();
      ok = std::vector<std::int32_t>(got.begin(), got.end()) == expected &&
           out.shape() == Shape{n * (n + 1) / 2, 2};
    } else {
      ok = out.num_elements() == 0 && out.data() == nullptr;
    }
    CHECK(all_ranks(ok));
  }
}

TEST_CASE("scatter: each rank gets its rows of the root's input", "[rooted]") {
  Session session;
  const int n = size();
  const int r = rank();
  for (int root = 0; root < n; ++root) {
    // The root splits s + 1 rows of 3 floats to set-rank s; row k holds 100 k + j.
    const std::int64_t rows = n * (n + 1) / 2;
    std::vector<float> in;
    std::vector<std::int64_t> splits;
    if (r == root) {
      for (std::int64_t k = 0; k < rows; ++k)
        for (int j = 0; j < 3; ++j) in.push_back(100.0f * k + j);
      for (int s = 0; s < n; ++s) splits.push_back(s + 1);
    }
    const TensorView view =
        r == root ? TensorView(in.data(), {rows, 3}) : TensorView(nullptr, DataType::Float32, {0});
    const Tensor out = scatter(view, root, splits, "rooted.scatter");
    const std::int64_t first = r * (r + 1) / 2;  // Rows before set-rank r.
    std::vector<float> expected;
    for (std::int64_t k = first; k < first + r + 1; ++k)
      for (int j = 0; j < 3; ++j) expected.push_back(100.0f * k + j);
    const std::span<const float> got = out.span<float>();
    CHECK(all_ranks(std::vector<float>(got.begin(), got.end()) == expected &&
                    out.shape() == Shape{r + 1, 3}));
    // Equal splits: n rows of 1 int64, row k = k.
    std::vector<std::int64_t> equal;
    if (r == root)
      for (int k = 0; k < n; ++k) equal.push_back(k);
    const Tensor one = scatter(
        r == root ? TensorView(equal.data(), {n, 1}) : TensorView(nullptr, DataType::Int64, {0}),
        root, {}, "rooted.equal");
    CHECK(all_ranks(one.shape() == Shape{1, 1} && one.span<std::int64_t>()[0] == r));
  }
}

TEST_CASE("rooted ops: a bad root is InvalidArgument, a disputed root Mismatch", "[rooted]") {
  Session session;
  const int n = size();
  std::vector<float> v(2, 1.0f);
  CHECK(error_of([&] { reduce_async(TensorView(v.data(), {2}), n, "bad.root"); }) ==
        ErrorCode::InvalidArgument);
  CHECK(error_of([&] { gather_async(TensorView(v.data(), {2}), -1, "bad.root"); }) ==
        ErrorCode::InvalidArgument);
  CHECK(error_of([&] {
          reduce_async(TensorView(v.data(), {2}), 0, "adasum", {.op = ReduceOp::Adasum});
        }) == ErrorCode::InvalidArgument);
  if (n > 1) {
    // Rank 0 names root 0, the others root 1.
    const int root = rank() == 0 ? 0 : 1;
    std::string message;
    CHECK(all_ranks(error_of([&] { reduce(TensorView(v.data(), {2}), root, "disputed"); },
                             &message) == ErrorCode::Mismatch));
    CHECK(message.find("root") != std::string::npos);
  }
}

}  // namespace
}  // namespace tutti::test
