// SPDX-License-Identifier: Apache-2.0
// What the distributed optimizers share: their options (DistributedOptions) and the guard of
// skip_synchronize(). Used by optim::DistributedOptimizer (tutti/optim/distributed_optimizer.h)
// and libtorch::DistributedOptimizer (tutti/libtorch.h); it needs nothing of tutti/nn.h.
#pragma once

#include <string>
#include <vector>

#include "tutti/collectives.h"
#include "tutti/export.h"
#include "tutti/process_set.h"

namespace tutti::optim {

// How gradients travel: tutti::Compression (tutti/collectives.h), under its Horovod-style name.
// FP16/BF16 convert each gradient into a 2-byte temporary, reduce it and convert the result
// back into grad().
using Compression = tutti::Compression;

struct DistributedOptions {
  // Average (the default: the mean of the ranks' gradients, what a single process on the whole
  // batch computes when the loss is a mean), Sum, or Adasum (adaptive summation; floating
  // types only, a power-of-two set size on CPU). Others are InvalidArgument.
  ReduceOp op = ReduceOp::Average;
  Compression compression = Compression::None;
  // k >= 1: gradients of k backward passes are accumulated locally (summed into grad(), not
  // divided by k) and reduced once, from the k-th pass's hook. A (k+1)-th backward() before
  // step() throws InvalidArgument from that backward(). Memory stays the same; communication
  // happens every k passes.
  int backward_passes_per_step = 1;
  // f > 0, Average only (InvalidArgument with another op when f != 1). Horovod's split of the
  // averaging: each gradient is multiplied by 1/f before the sum and the sum by f/size after,
  // to keep fp16 sums in range. The result is the same average up to rounding.
  double gradient_predivide_factor = 1.0;
  // N > 0 splits the parameters, in parameters() order, into N contiguous groups of nearly
  // equal count (the first ones one larger), each reduced as one grouped_allreduce_async once
  // all its gradients are ready: fewer, larger messages, later start. Clamped to the number of
  // parameters. 0 with no `groups`: tutti::default_gradient_groups() (TUTTI_GRADIENT_GROUPING;
  // by default one group where some host's ranks fill its cores, else each gradient alone).
  // Cannot be combined with `groups` (InvalidArgument).
  int num_groups = 0;
  // Explicit groups by parameter name, each reduced as one grouped allreduce once all its
  // gradients are ready; parameters in no list are reduced alone. Must be identical on every
  // rank. An unknown name (not a parameter of the optimizer), a frozen parameter's name (it
  // has no gradient), a name repeated within or across lists, or an empty list is
  // InvalidArgument.
  std::vector<std::vector<std::string>> groups = {};  // "= {}": no -Wextra warning when omitted.
  // The ranks that train together. Ranks outside it may build the optimizer; on them it does
  // not communicate and step() only runs the inner optimizer.
  ProcessSet process_set = ProcessSet::global();
};

// The guard skip_synchronize() returns (each distributed optimizer names it SkipSynchronize):
// while one is alive, the optimizer's step() does not synchronize. Guards nest. Movable, not
// copyable; must not outlive the optimizer that made it.
class SkipSynchronizeGuard {
 public:
  // Made by skip_synchronize(), over the optimizer's count of live guards.
  explicit SkipSynchronizeGuard(int& depth) : depth_(&depth) { ++*depth_; }
  SkipSynchronizeGuard(SkipSynchronizeGuard&& other) noexcept : depth_(other.depth_) {
    other.depth_ = nullptr;
  }
  SkipSynchronizeGuard(const SkipSynchronizeGuard&) = delete;
  SkipSynchronizeGuard& operator=(const SkipSynchronizeGuard&) = delete;
  SkipSynchronizeGuard& operator=(SkipSynchronizeGuard&&) = delete;
  ~SkipSynchronizeGuard() {
    if (depth_ != nullptr) --*depth_;
  }

 private:
  int* depth_;
};

}  // namespace tutti::optim
