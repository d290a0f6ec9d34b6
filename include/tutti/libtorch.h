// SPDX-License-Identifier: Apache-2.0
// The LibTorch adapter (API.md, "LibTorch"): torch::Tensor <-> Tutti tensors, the broadcast
// helpers for a LibTorch model and optimizer, their elastic::State entries, and
// DistributedOptimizer, the data-parallel wrapper of a torch::optim::Optimizer. Library
// libtutti_libtorch (pkg-config tutti-libtorch); needs LibTorch's include flags. libtutti
// itself never depends on LibTorch.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "tutti/collectives.h"
#include "tutti/elastic.h"
#include "tutti/optim/distributed_options.h"
#include "tutti/process_set.h"
#include "tutti/tensor.h"

namespace tutti::libtorch {

// A view of `tensor`'s memory, for the collectives. The tensor must be contiguous, on the CPU
// (or CUDA in a CUDA build), of a dtype Tutti has (kUInt8, kInt8, kInt16, kInt32, kInt64,
// kFloat16, kBFloat16, kFloat32, kFloat64, kBool); otherwise InvalidArgument naming the
// problem ("non-contiguous", the dtype's name, the device). The view does not keep the
// memory alive.
TensorView view(const torch::Tensor& tensor);

// A torch::Tensor over `tensor`'s memory, which it keeps alive. InvalidArgument for a dtype
// LibTorch lacks (UInt16 in LibTorch 1.13).
torch::Tensor to_torch(const Tensor& tensor);

// Broadcasts every tensor of `parameters` (module->named_parameters() or named_buffers()) from
// `root_rank` (a global rank, a member of the set), in place, one grouped broadcast per dtype
// in name order. Collective: every member passes the same names. InvalidArgument for a tensor
// that view() rejects, or a root outside the set.
void broadcast_parameters(const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                          int root_rank, ProcessSet process_set = ProcessSet::global());

// Makes every member's optimizer state and hyper-parameters (each parameter group's options:
// learning rate, momentum, betas, ...) equal to the root's, before or after the first step.
// `root_rank` is a global rank, a member of the set (InvalidArgument otherwise); a rank
// outside the set returns at once.
// The root serializes `optimizer` with LibTorch's own archive (torch::serialize), the bytes
// travel with broadcast_object, the others load them. Works for any optimizer LibTorch can
// save (SGD, Adam, AdamW, RMSprop, Adagrad, ...); every member must have the same parameter
// groups and shapes.
void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root_rank,
                               ProcessSet process_set = ProcessSet::global());

// Tutti addition: `module`'s parameters and buffers (named_parameters() and named_buffers(),
// its submodules' included), as an object an elastic::State commits, restores and syncs:
//   state.add("model", tutti::libtorch::stateful(*model));
//   state.add("optimizer", tutti::libtorch::stateful(adam));
// Saved as CPU copies; loaded in place with copy_(), each onto its tensor's own device, so the
// optimizer and a DistributedOptimizer's hooks keep the tensors they hold. A commit whose
// tensors differ from the module's (count, names, dtypes or shapes) is refused: restore() and
// sync() throw InvalidArgument on every rank naming the first difference, and nothing
// changes. A tensor of a dtype view() rejects fails the commit. `module` must outlive the
// State.
elastic::Stateful stateful(torch::nn::Module& module);

// Tutti addition: `optimizer`'s state and each parameter group's options (learning rate, ...),
// in LibTorch's own archive as broadcast_optimizer_state() sends them, as an object an
// elastic::State commits, restores and syncs. Loading checks what LibTorch's load checks: a
// commit of another number of parameter groups, or of groups of other sizes, is refused as
// above, and nothing changes. `optimizer` must outlive the State.
elastic::Stateful stateful(torch::optim::Optimizer& optimizer);

// optim::DistributedOptimizer for LibTorch (see tutti/optim/distributed_optimizer.h for the
// semantics of every DistributedOptions field, synchronize(), skip_synchronize() and the
// warning). A post-accumulate hook on each parameter's gradient accumulator starts that
// gradient's allreduce (name "DistributedOptimizer.allreduce.<name>", groups
// "DistributedOptimizer.grouped_allreduce.<first parameter's name>") the moment autograd has
// accumulated it, mid-backward. With Compression::None and a contiguous float gradient, grad()
// itself is reduced in place (no copy); FP16/BF16 go through a 2-byte temporary. A parameter
// without a gradient gets a zero-filled grad(). A tensor listed under two names is reduced once,
// under its first name. Inside skip_synchronize() without an explicit synchronize(), the reductions
// the hooks started are waited for and applied, as in optim::DistributedOptimizer.
//
//   tutti::libtorch::DistributedOptimizer opt(sgd, model->named_parameters());
//   opt.zero_grad(); loss.backward(); opt.step();
//
// Throws InvalidArgument for bad options, a name repeated in named_parameters, or a parameter
// of `inner` that has no name.
class DistributedOptimizer {
 public:
  DistributedOptimizer(torch::optim::Optimizer& inner,
                       const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
                       optim::DistributedOptions options = {});
  // Waits for reductions in flight (ignoring their errors); the hooks then do nothing.
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  void step();  // synchronize() first unless inside skip_synchronize(); then inner.step().
  // inner.zero_grad(); InvalidArgument while reductions are in flight.
  void zero_grad();
  // Tutti addition: call where a backward() of this step threw on this rank (torch gives the
  // hooks no word of it). Blocking, collective with the other ranks' step: starts every
  // reduction this rank owes the step, with its gradients as they stand (an absent grad() as
  // zeros), and waits for all of them, results not written, so that the other ranks' step
  // completes and this rank's next step pairs with their next one. This rank skips the step:
  // step() and synchronize() throw InvalidArgument until zero_grad(). A no-op when a reduction
  // of the round failed already. Without it, a rank whose backward() threw before any hook ran
  // would pair its next step with the others' current one, and every later step would average
  // gradients a step apart.
  void backward_failed();
  void synchronize();
  class SkipSynchronize;
  [[nodiscard]] SkipSynchronize skip_synchronize();
  torch::optim::Optimizer& inner() const { return inner_; }
  // Tutti addition: the reductions (units) started this round so far, by the hooks or
  // synchronize(); tests use it to see that hooks start reductions mid-backward.
  int reductions_started() const;

 private:
  struct State;

  torch::optim::Optimizer& inner_;
  std::shared_ptr<State> state_;  // Shared (weakly) with the hooks.
  int skip_depth_ = 0;            // Live SkipSynchronize guards.
};

// RAII guard: while alive, step() does not synchronize. Guards nest. Movable, not copyable.
class DistributedOptimizer::SkipSynchronize : public optim::SkipSynchronizeGuard {
 public:
  using SkipSynchronizeGuard::SkipSynchronizeGuard;
};

inline DistributedOptimizer::SkipSynchronize DistributedOptimizer::skip_synchronize() {
  return SkipSynchronize(skip_depth_);
}

}  // namespace tutti::libtorch
