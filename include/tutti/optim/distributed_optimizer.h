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
#include "tutti/optim/distributed_options.h"
#include "tutti/optim/optimizer.h"
#include "tutti/process_set.h"

namespace tutti::optim {

// Wraps `inner` (by reference: it must outlive this object) so that step() updates the
// parameters from gradients reduced across options.process_set. parameters() are inner's;
// state_dict() and load_state_dict() are inner's too.
//
// How a training step flows (every member of the set runs the same steps):
//   loss.backward()   each parameter's hook fires when its gradient is final and starts
//                     allreduce_async of it under the name
//                     "DistributedOptimizer.allreduce.<parameter name>" (groups:
//                     "DistributedOptimizer.grouped_allreduce.<its first parameter's name>",
//                     as Horovod), identical on every rank. Uncompressed gradients are
//                     reduced where they lie; FP16/BF16 ones through a 2-byte copy.
//   opt.step()        synchronize(): starts the reductions still missing, waits for all, and
//                     copies each result into its grad(); then inner.step().
//   opt.zero_grad()   inner.zero_grad().
// While a gradient's reduction is in flight (from the hook that starts it until synchronize()
// waits for it), an uncompressed gradient is being reduced where it lies and its parameter's
// grad() holds a spare tensor of its shape instead (zeros): what is read there is not the
// gradient, and what is written there is lost. Read or change gradients in grad hooks
// registered before this constructor (they run first; what they write is reduced), or after
// synchronize(). With FP16/BF16 compression grad() keeps the local gradient until synchronize().
//
// Two optimizers over disjoint parameters of one model (a body's and a head's) may share each
// backward(): their reductions are named after their parameters, so give both the model's
// named_parameters (the default names "noname.<index>" would be the same in both).
//
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
  // skip_synchronize(), step() starts no reduction: those the hooks already started are waited
  // for and their results applied, so inner.step() sees the reduced gradients after an explicit
  // synchronize(), else what the hooks reduced and this rank's own gradients elsewhere (as
  // Horovod's in-place reductions). When a reduction fails (Mismatch, Stalled, ShutDown) step()
  // throws it and inner.step() is not run; the gradients are then partly reduced, so step(),
  // synchronize() and the next backward() throw Error(InvalidArgument) until zero_grad(). A
  // backward() refused after synchronize() (or for a pass over backward_passes_per_step) does
  // the same, having added into gradients the step would use; but while the reductions of the
  // gradients it reached are still in flight, their results replace what it added, so only the
  // refused pass is lost and step() goes on. A backward() that threw on this rank for another
  // reason (a hook, a grad() of the wrong shape) has started the reductions this rank owed, with
  // its gradients as they stood, and waited for them (the parameters' failed-pass hooks), so the
  // other ranks' step went on; this rank skips the step: step() and synchronize() throw
  // Error(InvalidArgument) until zero_grad(), and it goes on with the next step's backward().
  void step() override;
  // inner.zero_grad(), which also ends a failed step's block (see step()). Throws
  // Error(InvalidArgument) while gradient reductions are in flight (between the hooks that
  // started them and synchronize()), since they would overwrite the zeros with the reduced
  // gradient.
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
  int skip_depth_ = 0;            // Live SkipSynchronize guards.
};

// RAII guard: see DistributedOptimizer::skip_synchronize(). Movable, not copyable.
class DistributedOptimizer::SkipSynchronize : public SkipSynchronizeGuard {
 public:
  using SkipSynchronizeGuard::SkipSynchronizeGuard;
};

inline DistributedOptimizer::SkipSynchronize DistributedOptimizer::skip_synchronize() {
  return SkipSynchronize(skip_depth_);
}

}  // namespace tutti::optim
