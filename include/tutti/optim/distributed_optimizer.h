// SPDX-License-Identifier: Apache-2.0
// DistributedOptimizer: Horovod's data-parallel optimizer. It wraps any Optimizer, averages
// (or sums) every gradient across the ranks of a process set, and starts each allreduce from
// the parameter's grad hook so communication overlaps the rest of backward().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tutti/collectives.h"
#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/optim/optimizer.h"
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
  // parameters. 0 = no grouping. Cannot be combined with `groups` (InvalidArgument).
  int num_groups = 0;
  // Explicit groups by parameter name, each reduced as one grouped allreduce once all its
  // gradients are ready; parameters in no list are reduced alone. Must be identical on every
  // rank. An unknown name (not a parameter of the optimizer), a name repeated within or
  // across lists, or an empty list is InvalidArgument.
  std::vector<std::vector<std::string>> groups = {};  // "= {}": no -Wextra warning when omitted.
  // The ranks that train together. Ranks outside it may build the optimizer; on them it does
  // not communicate and step() only runs the inner optimizer.
  ProcessSet process_set = ProcessSet::global();
};

// Wraps `inner` (by reference: it must outlive this object) so that step() updates the
// parameters from gradients reduced across options.process_set. parameters() are inner's;
// state_dict() and load_state_dict() are inner's too.
//
// How a training step flows (every member of the set runs the same steps):
//   loss.backward()   each parameter's hook fires when its gradient is final and starts
//                     allreduce_async of it under the name
//                     "DistributedOptimizer.allreduce.<parameter name>" (groups:
//                     "DistributedOptimizer.grouped_allreduce.<group index>"), identical on
//                     every rank. The gradient is first copied (or compressed) into a private
//                     buffer, so the background thread never touches grad().
//   opt.step()        synchronize(): starts the reductions still missing, waits for all, and
//                     copies each result into its grad(); then inner.step().
//   opt.zero_grad()   inner.zero_grad().
// Gradient clipping and other edits of the reduced gradients:
//   opt.synchronize(); clip(...);
//   { auto guard = opt.skip_synchronize(); opt.step(); }
//
// Collective over the set: the reductions are matched by parameter name, so every member
// must construct the optimizer over the same names and run the same number of steps. A
// parameter that produced no gradient on some rank (its hook did not fire there) is reduced
// by synchronize() with that rank's current grad(), which is zero unless the caller
// accumulated gradients without zero_grad(); no rank waits for it forever.
//
// Threads: the hooks run on the thread that calls backward(); the other members are called
// from one application thread. Errors of the reductions (Mismatch, ShutDown, ...) are thrown
// by synchronize()/step(), after every pending reduction has been waited for.
//
// Behaviour is the same at size 1 (the reductions run, and the checks apply).
class TUTTI_API DistributedOptimizer : public Optimizer {
 public:
  // Registers a grad hook on every parameter of `inner` that requires grad. `named_parameters`
  // names them (usually model.named_parameters()); an empty list names them
  // "noname.<index in parameters()>". Names of variables that are not parameters of `inner`
  // are ignored. Does not communicate (no runtime call happens before the first hook).
  // Throws Error(InvalidArgument) for a repeated name, a parameter of `inner` that has no
  // name, or bad options (see DistributedOptions).
  DistributedOptimizer(Optimizer& inner, nn::NamedParameters named_parameters,
                       DistributedOptions options = {});
  // Waits for reductions still in flight (ignoring their errors) and disables the hooks, which
  // stay registered on the parameters but do nothing afterwards.
  ~DistributedOptimizer() override;
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // synchronize() unless inside skip_synchronize(), then inner.step() and a new round (the
  // backward-pass counters restart). After an explicit synchronize() and outside
  // skip_synchronize(), logs once per optimizer the warning "step() called without
  // skip_synchronize()" on stderr; the gradients are not reduced twice. Inside
  // skip_synchronize(), step() reduces nothing: reductions the hooks already started are
  // waited for and their results dropped, so inner.step() sees grad() as it is (the reduced
  // gradients after an explicit synchronize(), this rank's own otherwise).
  void step() override;
  // inner.zero_grad(). Throws Error(InvalidArgument) while gradient reductions are in flight
  // (between the hooks that started them and synchronize()), since they would overwrite the
  // zeros with the reduced gradient.
  void zero_grad() override;
  StateDict state_dict() const override;                  // inner.state_dict()
  void load_state_dict(const StateDict& state) override;  // inner.load_state_dict(state)

  // Starts the reductions that have not started (parameters whose hook did not fire, or fired
  // fewer than backward_passes_per_step times, and incomplete groups), waits for all of them,
  // and writes the results into the gradients. Blocking, collective over the set. Calling it
  // again before step() does nothing. Rethrows the first reduction error after waiting for
  // the others.
  void synchronize();

  // While a guard returned by skip_synchronize() is alive, step() does not synchronize.
  // Guards nest. Must not outlive the optimizer.
  class SkipSynchronize;
  [[nodiscard]] SkipSynchronize skip_synchronize();

  // Tutti addition: the wrapped optimizer.
  Optimizer& inner() const { return inner_; }

 private:
  struct State;

  Optimizer& inner_;
  std::shared_ptr<State> state_;  // Shared (weakly) with the hooks; see the destructor.
  int skip_depth_ = 0;
  bool synchronized_explicitly_ = false;  // Since the last step().
  bool warned_ = false;
};

// RAII guard: see DistributedOptimizer::skip_synchronize(). Movable, not copyable.
class DistributedOptimizer::SkipSynchronize {
 public:
  SkipSynchronize(SkipSynchronize&& other) noexcept : optimizer_(other.optimizer_) {
    other.optimizer_ = nullptr;
  }
  SkipSynchronize(const SkipSynchronize&) = delete;
  SkipSynchronize& operator=(const SkipSynchronize&) = delete;
  SkipSynchronize& operator=(SkipSynchronize&&) = delete;
  ~SkipSynchronize() {
    if (optimizer_ != nullptr) --optimizer_->skip_depth_;
  }

 private:
  friend class DistributedOptimizer;
  explicit SkipSynchronize(DistributedOptimizer* optimizer) : optimizer_(optimizer) {
    ++optimizer_->skip_depth_;
  }

  DistributedOptimizer* optimizer_;
};

inline DistributedOptimizer::SkipSynchronize DistributedOptimizer::skip_synchronize() {
  return SkipSynchronize(this);
}

}  // namespace tutti::optim
