// SPDX-License-Identifier: Apache-2.0
// What a synchronized batch-norm layer (SyncBatchNorm, or a BatchNorm1d/2d converted by
// convert_sync_batchnorm()) keeps, and the reducer that sums its statistics over the set.
// Private to src/nn.
#pragma once

#include <memory>
#include <string>

#include "src/nn/batch_norm_op.h"
#include "tutti/nn/batch_norm.h"
#include "tutti/process_set.h"

namespace tutti::nn::detail {

struct BatchNormSync {
  ProcessSet process_set;
  // "SyncBatchNorm.<k>": the name of this layer's backward allreduce; its forward allgather is
  // "SyncBatchNorm.<k>.statistics". k numbers the synchronized layers in creation order, which
  // is the same on every rank that builds the same model.
  std::string name;
};

// A new BatchNormSync over `process_set` with the next layer number.
std::shared_ptr<const BatchNormSync> make_batch_norm_sync(ProcessSet process_set);

// Gathers forward's statistics over sync.process_set (blocking allgather) and sums backward's
// in place (blocking allreduce, Sum, float64); its sum_zeros starts that allreduce of zeros and
// waits for it in a backward callback.
StatisticsReducer sync_reducer(const BatchNormSync& sync);

// convert_sync_batchnorm()'s way into BatchNorm1d/2d.
struct BatchNormAccess {
  template <class BatchNorm>
  static void set_sync(BatchNorm& layer, std::shared_ptr<const BatchNormSync> sync) {
    layer.sync_ = std::move(sync);
  }
};

}  // namespace tutti::nn::detail
