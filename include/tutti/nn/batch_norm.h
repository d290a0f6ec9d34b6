// SPDX-License-Identifier: Apache-2.0
// Batch normalization over the channels of 2-d/3-d (BatchNorm1d) and 4-d (BatchNorm2d) inputs.
#pragma once

#include <cstdint>
#include <memory>

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/nn/variable.h"

namespace tutti::nn {

namespace detail {
class BatchNormSync;
struct BatchNormAccess;
}  // namespace detail

// y = (x - mean) / sqrt(var + 1e-5) * weight + bias per channel, as torch.nn.BatchNorm1d/2d
// with their defaults (eps 1e-5, momentum 0.1, affine, tracking running statistics).
//
// Training mode normalizes with the batch's mean and biased variance over every dimension but
// the channel's, and updates the buffers: running = 0.9 running + 0.1 batch, with the unbiased
// batch variance for "running_var". Evaluation mode normalizes with the buffers. Parameters
// "weight" (ones) and "bias" (zeros), buffers "running_mean" (zeros) and "running_var" (ones),
// all [channels]. Buffers are local: each rank updates its own, unless convert_sync_batchnorm()
// (tutti/nn/parallel.h) switched the layer to SyncBatchNorm's statistics over a process set.
// forward() may run on several threads at once (DataParallel): the running-statistics update
// is locked, each thread normalizing its own part with its own batch statistics.
// Throws InvalidArgument for a non-positive channel count.
class TUTTI_API BatchNorm1d : public Module {
 public:
  explicit BatchNorm1d(std::int64_t features);

  // input [n, features] or [n, features, l] -> same shape. Throws InvalidArgument for another
  // shape, or in training mode when a channel has a single value (n * l == 1). An empty batch
  // (n * l == 0) gives an empty output and leaves the running statistics alone, as PyTorch's.
  Variable forward(const Variable& input) override;

 private:
  friend struct detail::BatchNormAccess;

  std::int64_t features_;
  Variable weight_;
  Variable bias_;
  Variable running_mean_;
  Variable running_var_;
  // Set by convert_sync_batchnorm(): training mode then normalizes over this process set.
  std::shared_ptr<const detail::BatchNormSync> sync_;
};

// As BatchNorm1d, for input [n, channels, h, w] -> same shape, normalizing over n, h and w.
class TUTTI_API BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(std::int64_t channels);

  Variable forward(const Variable& input) override;

 private:
  friend struct detail::BatchNormAccess;

  std::int64_t channels_;
  Variable weight_;
  Variable bias_;
  Variable running_mean_;
  Variable running_var_;
  // Set by convert_sync_batchnorm(): training mode then normalizes over this process set.
  std::shared_ptr<const detail::BatchNormSync> sync_;
};

}  // namespace tutti::nn
