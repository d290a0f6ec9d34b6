// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the training MPI tests: a runtime session per test case, a small model, a
// deterministic data set split across ranks, and comparisons. The single-process oracle each
// test uses is a second model trained on the whole batch on every rank, with no communication.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "test/support/mpi_test_util.h"
#include "tutti/nn.h"
#include "tutti/tutti.h"

namespace tutti::test {

// Linear(4, 8) -> ReLU -> Linear(8, 2): parameters "0.weight", "0.bias", "2.weight", "2.bias".
// The same `seed` gives the same weights on every rank.
inline std::shared_ptr<nn::Sequential> make_model(std::uint64_t seed) {
  nn::manual_seed(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(4, 8))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(8, 2));
  return model;
}

inline std::vector<nn::Variable> variables(const nn::NamedParameters& named) {
  std::vector<nn::Variable> out;
  for (const auto& [name, v] : named) out.push_back(v);
  return out;
}

// A fixed regression batch of `rows` samples: inputs [rows, 4], targets [rows, 2].
struct Batch {
  Tensor x;
  Tensor y;
};

inline Batch make_batch(std::int64_t first, std::int64_t rows) {
  std::vector<float> xs, ys;
  for (std::int64_t i = first; i < first + rows; ++i) {
    for (int j = 0; j < 4; ++j) xs.push_back(static_cast<float>(std::sin(0.7 * i + 1.3 * j)));
    ys.push_back(static_cast<float>(std::cos(0.5 * i)));
    ys.push_back(static_cast<float>(0.25 * (i % 5) - 0.5));
  }
  return {Tensor::from<float>(xs, {rows, 4}), Tensor::from<float>(ys, {rows, 2})};
}

// The global batch has kBatch rows (divisible by 1, 2, 3 and 4); rank r of n takes an equal
// contiguous share, so the mean of the shards' mean-loss gradients is the batch's.
constexpr std::int64_t kBatch = 12;

inline Batch shard(int rank, int size, std::int64_t step) {
  const std::int64_t rows = kBatch / size;
  return make_batch(step * kBatch + rank * rows, rows);
}

inline Batch full_batch(std::int64_t step) { return make_batch(step * kBatch, kBatch); }

inline void forward_backward(nn::Module& model, const Batch& batch) {
  nn::Variable loss = nn::mse_loss(model.forward(batch.x), batch.y);
  loss.backward();
}

// Largest |a - b| over the values (or grads) of two parameter lists of the same shapes.
inline double max_diff(const nn::NamedParameters& a, const nn::NamedParameters& b,
                       bool grads = false, double scale_b = 1.0) {
  double worst = a.size() == b.size() ? 0.0 : 1e30;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const Tensor& ta = grads ? a[i].second.grad() : a[i].second.value();
    const Tensor& tb = grads ? b[i].second.grad() : b[i].second.value();
    const auto sa = ta.span<float>();
    const auto sb = tb.span<float>();
    if (sa.size() != sb.size()) return 1e30;
    for (std::size_t j = 0; j < sa.size(); ++j) {
      worst = std::max(worst, std::abs(static_cast<double>(sa[j]) - scale_b * sb[j]));
    }
  }
  return worst;
}

// True on every rank iff every rank holds the same bytes as `root` (an MPI_Bcast oracle).
inline bool same_as_root(const std::vector<double>& mine, int root) {
  int count = static_cast<int>(mine.size());
  MPI_Bcast(&count, 1, MPI_INT, root, MPI_COMM_WORLD);
  std::vector<double> roots = mine;
  roots.resize(static_cast<std::size_t>(count));
  MPI_Bcast(roots.data(), count, MPI_DOUBLE, root, MPI_COMM_WORLD);
  return all_ranks(roots == mine);
}

inline std::vector<double> flatten_values(const nn::NamedParameters& params) {
  std::vector<double> out;
  for (const auto& [name, v] : params) {
    for (float f : v.value().span<float>()) out.push_back(f);
  }
  return out;
}

// True on every rank iff `mine` holds the same values on every rank of the world (plain MPI's
// min and max of each; the vectors must have one length everywhere).
inline bool same_on_every_rank(const std::vector<double>& mine) {
  std::vector<double> low(mine.size()), high(mine.size());
  const int count = static_cast<int>(mine.size());
  MPI_Allreduce(mine.data(), low.data(), count, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(mine.data(), high.data(), count, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return all_ranks(low == high);
}

}  // namespace tutti::test
