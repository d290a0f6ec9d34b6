// SPDX-License-Identifier: Apache-2.0
// The batch-normalization operation shared by BatchNorm1d/2d and SyncBatchNorm: one recorded
// operation over an input viewed as [n, c, inner]. Private to src/nn.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::nn::detail {

// How a synchronized layer reduces; every member empty for the local BatchNorm.
struct StatisticsReducer {
  // Gathers `row` from every rank that normalizes together (SyncBatchNorm: one allgather over
  // its process set; a joined member sends none): a float64 tensor [ranks, row.size()] in rank
  // order, the same on every rank. Called in forward with each rank's element count, then per
  // channel its mean and its sum of squared deviations from that mean.
  std::function<Tensor(std::span<const double> row)> gather;
  // Sums `values` in place over the same ranks (one allreduce). Called in backward, with
  // identical layouts on every rank (per channel: sums of the output gradient, then sums of
  // gradient times normalized input).
  std::function<void(std::span<double> values)> sum;
  // A backward() on this rank threw before this layer's backward began, while the other ranks'
  // backward waits in its reduction: takes part in it with `count` zeros, not waiting for it
  // there (Note [A walk that throws] in src/nn/backward_walk.cc).
  std::function<void(std::int64_t count)> sum_zeros;

  explicit operator bool() const { return static_cast<bool>(sum); }
};

// y = (x - mean) / sqrt(var + 1e-5) * weight + bias per channel of x [n, c, inner]
// (torch.nn.BatchNorm's defaults: eps 1e-5, momentum 0.1). In training mode mean and the biased
// var come from the batch (with `reduce`: from every rank's batch) and the running statistics
// are updated in place (running_var with the unbiased variance), under a lock shared by all
// batch-norm layers so that DataParallel's threads do not race; otherwise the running
// statistics normalize. Throws InvalidArgument in training mode when fewer than two values per
// channel are seen (counting every rank's with `reduce`).
// Backward: weight and bias get this rank's own sums; the input gradient accounts for every
// rank's batch (`reduce` is called once more) as SyncBatchNorm's contract says. With `reduce`,
// in training mode, for an input that requires grad, a backward() that throws before this
// operation's backward began sends zeros to that reduction instead (reduce.sum_zeros), so that
// the other ranks' backward completes.
Variable batch_norm(const Variable& input, const Variable& weight, const Variable& bias,
                    const Tensor& running_mean, const Tensor& running_var, bool training,
                    std::int64_t n, std::int64_t c, std::int64_t inner,
                    const StatisticsReducer& reduce = {});

}  // namespace tutti::nn::detail
