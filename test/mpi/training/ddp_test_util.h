// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the DistributedDataParallel and SyncBatchNorm MPI tests: a small CNN and its
// image batches, DDP's parameter lists, and the training step both sides run. Oracles are
// identical models trained with plain nn in one process (on every rank, no communication).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "test/mpi/training/training_test_util.h"
#include "tutti/nn.h"
#include "tutti/optim.h"

namespace tutti::test {

// Conv2d(1, 3, 3, padding 1) -> ReLU -> MaxPool2d(2) -> Flatten -> Linear(27, 2) on [n, 1, 6, 6].
inline std::shared_ptr<nn::Sequential> make_cnn(std::uint64_t seed) {
  nn::manual_seed(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Conv2d>(1, 3, 3, 1, 1))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::MaxPool2d>(2))
      .add(std::make_shared<nn::Flatten>())
      .add(std::make_shared<nn::Linear>(27, 2));
  return model;
}

// Images [rows, 1, 6, 6] and targets [rows, 2] for samples first .. first + rows - 1.
inline Batch make_image_batch(std::int64_t first, std::int64_t rows) {
  std::vector<float> xs, ys;
  for (std::int64_t i = first; i < first + rows; ++i) {
    for (int j = 0; j < 36; ++j) xs.push_back(static_cast<float>(std::sin(0.37 * i + 0.91 * j)));
    ys.push_back(static_cast<float>(std::cos(0.5 * i)));
    ys.push_back(static_cast<float>(0.2 * (i % 4) - 0.3));
  }
  return {Tensor::from<float>(xs, {rows, 1, 6, 6}), Tensor::from<float>(ys, {rows, 2})};
}

// Rank `rank`'s equal share of step `step`'s global batch of kBatch rows, or the whole batch.
inline Batch batch_for(bool images, int rank, int size, std::int64_t step) {
  const std::int64_t rows = kBatch / size;
  const std::int64_t first = step * kBatch + rank * rows;
  return images ? make_image_batch(first, rows) : make_batch(first, rows);
}
inline Batch whole_batch(bool images, std::int64_t step) {
  return images ? make_image_batch(step * kBatch, kBatch) : make_batch(step * kBatch, kBatch);
}

inline std::shared_ptr<nn::Sequential> make_net(bool cnn, std::uint64_t seed) {
  return cnn ? make_cnn(seed) : make_model(seed);
}

// The error code `f` throws, or Internal if it throws none; and its message.
template <class F>
std::pair<ErrorCode, std::string> error_from(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {ErrorCode::Internal, ""};
}

// Parameters by name (for bucket listings, which name them).
inline nn::Variable find(const nn::NamedParameters& named, const std::string& name) {
  for (const auto& [n, v] : named) {
    if (n == name) return v;
  }
  return {};
}

}  // namespace tutti::test
