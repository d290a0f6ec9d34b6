// SPDX-License-Identifier: Apache-2.0
// What a synchronized batch-norm layer (SyncBatchNorm, or a BatchNorm1d/2d converted by
// convert_sync_batchnorm()) keeps, and the reducer that sums its statistics over the set.
// Private to src/nn.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "src/nn/batch_norm_op.h"
#include "tutti/nn/batch_norm.h"
#include "tutti/process_set.h"

namespace tutti::nn::detail {

// Note [SyncBatchNorm names]
// A synchronized layer's collectives are matched across ranks by name, so the layer must have
// one name on every rank. Numbered in creation order (one count per process), layers had it only
// where every rank created the same synchronized layers in the same order: a rank that built one
// more before the model (an evaluation copy, say, made on rank 0 only) gave each later layer of
// its own another name, and the first forward waited until the stall inspector stopped the job
// (TUTTI_STALL_SHUTDOWN_TIME_SECONDS, 10 minutes by default). PyTorch's SyncBatchNorm asks only
// that ranks run the synchronized forwards in one order, which Tutti asks as well (each forward's
// allgather blocks). So a layer is numbered at its first training-mode forward, in a count of its
// own process set's layers: "SyncBatchNorm.<k>" is the set's k-th layer to train on this rank
// (the set is part of every op's key, so sets may share names). What a rank does besides a set's
// synchronized forwards leaves that set's numbers alone: layers made and never trained,
// evaluation passes, other sets' layers (those of a set a rank is not in, which it never trains).
class BatchNormSync {
 public:
  explicit BatchNormSync(ProcessSet process_set) : process_set_(std::move(process_set)) {}

  const ProcessSet& process_set() const { return process_set_; }
  // The name of the layer's backward allreduce; its forward allgather is name() +
  // ".statistics". The first call numbers the layer (Note [SyncBatchNorm names]): call it at
  // the layer's training-mode forwards only. Thread-safe.
  const std::string& name() const;

 private:
  const ProcessSet process_set_;
  mutable std::once_flag numbered_;
  mutable std::string name_;  // Written once, under numbered_.
};

// Gathers forward's statistics over sync.process_set() (blocking allgather) and sums backward's
// in place (blocking allreduce, Sum, float64); its sum_zeros starts that allreduce of zeros and
// waits for it in a backward callback. For training-mode forwards only: it names the layer.
StatisticsReducer sync_reducer(const BatchNormSync& sync);

// convert_sync_batchnorm()'s way into BatchNorm1d/2d.
struct BatchNormAccess {
  template <class BatchNorm>
  static void set_sync(BatchNorm& layer, std::shared_ptr<const BatchNormSync> sync) {
    layer.sync_ = std::move(sync);
  }
};

}  // namespace tutti::nn::detail
