// SPDX-License-Identifier: Apache-2.0
// The reduction engine of the distributed optimizers: units of parameters reduced together, the
// rounds from one step() to the next, synchronize(), skip_synchronize() and their errors. It
// knows parameters by index and name only; how a unit's gradients travel is the wrapper's
// (GradientBuffers). optim::DistributedOptimizer (Eigen tensors) and
// libtorch::DistributedOptimizer (torch::Tensor) keep only their hook wiring and buffers, as
// PyTorch's one Reducer serves DDP on every backend. A client of the public API.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "src/common/mutex.h"
#include "src/common/thread_annotations.h"
#include "tutti/collectives.h"
#include "tutti/optim/distributed_options.h"

namespace tutti::optim::internal {

// Note [Reduction rounds]
// A round runs from one step() to the next. Within it every reduction unit (a parameter, or a
// group of parameters reduced together) goes Idle -> InFlight -> Done exactly once:
//  1. Each hook firing counts a backward pass of its parameter. The k-th pass
//     (k = backward_passes_per_step) makes the parameter ready; when every member of its unit
//     is ready, the unit's reduction is started from the hook: communication overlaps the rest
//     of backward(). What travels is the wrapper's business (GradientBuffers::start).
//  2. synchronize() starts every unit still Idle (parameters whose hook fired fewer than k
//     times, or never, e.g. unused on this rank), so each rank submits every name once per
//     round and no rank waits forever; then it waits for all units and has the wrapper write
//     each result back into the gradients. A second synchronize() finds every unit Done and
//     does nothing, which is why step() after an explicit synchronize() does not reduce twice.
//  3. step() runs the inner optimizer and resets every unit to Idle and the counters to zero.
//     Inside skip_synchronize() it starts nothing: it waits for the units the hooks started
//     and applies their results (their buffers and names must be free for the next round), so
//     the inner step sees the reduced gradients of an explicit synchronize(), else what the
//     hooks reduced and this rank's own gradients elsewhere, as Horovod's in-place reductions
//     of p.grad would.
// A hook firing for a parameter that already made k passes, or whose unit already left Idle,
// is a (k+1)-th backward before step() and throws InvalidArgument from backward(). The
// decision to start a unit depends only on this rank's hooks, but the set of names each rank
// submits per round is the same (all units), which is what name-matched negotiation needs.
//
// Note [A failed round]
// A reduction that fails (a mismatch, a stall, shutdown) fails synchronize() or step(), and
// the inner step is not taken. The gradients are then not this rank's own any more, nor the
// average: a unit reduced in place (no compression: Note [Gradient buffers]) that completed
// before another failed holds the average, the rest local values. A backward() refused for an
// extra pass has likewise added its gradient into a reduced or counted one (unless its unit was
// in flight: then into the spare, or a gradient the result overwrites). Either way the
// round is over: the units in flight are waited for, every unit is Idle again, and until
// zero_grad() (clear_failure()) a step(), a synchronize() or a gradient hook throws
// InvalidArgument naming what failed. Before, a retried step() found every unit Done and stepped
// on the mixed gradients, each rank its own (the ranks' weights diverged), and the next
// backward() was refused as an extra pass.
//
// Note [A pass that failed]
// A backward() that throws on this rank (a hook, an operation's backward, a grad() of the wrong
// shape) before some hooks of its parameters ran leaves the units those hooks would have started
// Idle, while the other ranks wait in them. Were this rank to go on to its next pass, that pass's
// reductions would match theirs under the same names, and every later step would average
// gradients a step apart. A pass whose hooks all ran and that threw after them (at another
// leaf) counted towards backward_passes_per_step all the same. So the engine calls the
// parameters' failed-pass hooks (nn::Variable::register_failed_pass_hook), and on_failed_pass()
// starts every unit still Idle with the gradients as they stand (a grad() that cannot travel
// goes as zeros) and fails the round as above: it waits for every unit in flight, their results
// not written (each rank's own gradients come back), so that nothing is in flight when
// backward() throws, as DDP's pass waits too. step() and synchronize() are then refused until
// zero_grad(); the other ranks' step averaged this rank's gradients as they stood, so this rank
// skips the step (repeating it alone would pair it with the others' next one, which the message
// says). Not for a pass refused because its unit was already in flight (refuse_pass()): that
// round goes on, so the failed-pass hooks of that walk do nothing. The LibTorch wrapper has no
// failed-pass hooks (its backward is torch's, which tells nobody that it threw): its caller says
// so with libtorch::DistributedOptimizer::backward_failed(), which is on_failed_pass().

// One reduction: a single parameter or a group, under an op name identical on every rank.
struct ReductionUnit {
  std::size_t index = 0;             // Position among the units: 0, 1, ...
  std::string name;                  // "DistributedOptimizer.allreduce.<parameter name>", ...
  std::vector<std::size_t> members;  // Parameter indices.
  bool grouped = false;              // A grouped op even for one member.
};

// How a wrapper's gradients travel. Called with the engine's lock held, from the thread that
// runs backward() (hooks) or the optimizer's caller; never concurrently.
class GradientBuffers {
 public:
  virtual ~GradientBuffers() = default;
  // Starts the unit's reduction (allreduce_async or grouped_allreduce_async of its members'
  // gradients, or of copies, with `options`) and returns its handle. A throw leaves every
  // gradient in place (the unit stays Idle).
  virtual Handle start(const ReductionUnit& unit, const ReduceOptions& options) = 0;
  // The unit's reduction is over: with `write_results` its results go into the gradients;
  // without (a failure, or an optimizer being destroyed) the gradients get their own storage
  // back, whatever it holds. Returns an error for synchronize() to throw (a gradient that could
  // not travel as it was), else null.
  virtual std::exception_ptr finish(const ReductionUnit& unit, bool write_results) = 0;
};

// Throws InvalidArgument (naming `who`, e.g. "DistributedOptimizer") for bad options.
void check_options(const DistributedOptions& options, const char* who);

// Throws InvalidArgument (naming `who`) for a `groups` entry that names one of `frozen`, the
// names of parameters that do not require grad: they have no gradient for a group to wait for,
// and the rounds, which only know the trainable parameters, would call the name unknown.
void refuse_frozen_in_groups(const DistributedOptions& options, const std::set<std::string>& frozen,
                             const char* who);

// The ReduceOptions of every unit: the op, the set and gradient_predivide_factor's split.
ReduceOptions reduce_options(const DistributedOptions& options);

// See Note [Reduction rounds]. Thread-safe: hooks run on the backward() thread, the rest on
// the optimizer's caller.
class ReductionRounds {
 public:
  // `names[i]` names parameter i; an empty name marks a parameter without a gradient (never
  // reduced, its hook must not be wired). Builds the units from options.num_groups /
  // options.groups (then every parameter alone). Throws InvalidArgument (naming `who`) for bad
  // options or groups. Does not communicate. `buffers` must outlive this object.
  ReductionRounds(DistributedOptions options, std::vector<std::string> names,
                  GradientBuffers& buffers, const char* who);
  ReductionRounds(const ReductionRounds&) = delete;
  ReductionRounds& operator=(const ReductionRounds&) = delete;

  // The hook of parameter `index` (one with a name). Step 1 of the Note; may throw
  // InvalidArgument (an extra backward pass) or whatever starting a reduction throws.
  void on_gradient(std::size_t index) TUTTI_EXCLUDES(mutex_);
  // Step 2, called by the user: collective over the set, blocking; rethrows the first error.
  void synchronize() TUTTI_EXCLUDES(mutex_);
  // Step 3: synchronize() unless `skipping` (then wait and apply what the hooks started), then
  // `inner_step`, then a new round. Logs the "step() called without skip_synchronize()"
  // warning once per optimizer (Horovod's) when an explicit synchronize() came first.
  void step(bool skipping, const std::function<void()>& inner_step) TUTTI_EXCLUDES(mutex_);
  // A parameter's failed-pass hook (Note [A pass that failed]): blocking, collective over the
  // set (it waits for the units in flight).
  void on_failed_pass() TUTTI_EXCLUDES(mutex_);
  // InvalidArgument (naming `what`) while a unit is in flight, whose result would overwrite
  // what the caller is about to do (zero_grad()).
  void check_none_in_flight(const char* what) TUTTI_EXCLUDES(mutex_);
  // zero_grad() was called: the gradients are fresh, and a failed round no longer blocks
  // (Note [A failed round]).
  void clear_failure() TUTTI_EXCLUDES(mutex_);
  // The units started this round so far (by hooks or synchronize()).
  int units_started() const TUTTI_EXCLUDES(mutex_);
  // How many units there are (fixed by the constructor).
  std::size_t unit_count() const TUTTI_EXCLUDES(mutex_);
  // For the destructor: waits for the units in flight (errors dropped, results not written);
  // the hooks do nothing afterwards.
  void stop() TUTTI_EXCLUDES(mutex_);

 private:
  enum class Phase { Idle, InFlight, Done };
  struct UnitState {
    ReductionUnit unit;
    std::size_t ready = 0;  // Members that made their k-th pass this round.
    Phase phase = Phase::Idle;
    Handle handle;
  };

  void add_unit(std::string name, std::vector<std::size_t> members, bool grouped)
      TUTTI_REQUIRES(mutex_);
  void build_units(const char* who) TUTTI_REQUIRES(mutex_);
  bool is_member() TUTTI_REQUIRES(mutex_);
  void start(UnitState& unit) TUTTI_REQUIRES(mutex_);
  void synchronize_locked() TUTTI_REQUIRES(mutex_);
  std::exception_ptr wait_all(bool write_results) TUTTI_REQUIRES(mutex_);
  void new_round() TUTTI_REQUIRES(mutex_);
  // Ends the round after `why` (Note [A failed round]): waits for the units in flight, results
  // not written, then a new round that refuses to go on until clear_failure().
  void fail_round(std::string why) TUTTI_REQUIRES(mutex_);
  // Refuses a backward pass of `state`'s unit with InvalidArgument `why`, ending the round
  // first unless the unit is in flight (Note [A failed round]).
  [[noreturn]] void refuse_pass(const UnitState& state, const std::string& why)
      TUTTI_REQUIRES(mutex_);
  // InvalidArgument naming the failure while a failed round blocks; `what` is the call refused.
  void check_not_failed(const char* what) const TUTTI_REQUIRES(mutex_);

  // Fixed by the constructor.
  const DistributedOptions options_;
  const ReduceOptions reduce_options_;
  const std::vector<std::string> names_;  // Per parameter; empty for those without a gradient.
  GradientBuffers& buffers_;

  mutable detail::Mutex mutex_;
  bool alive_ TUTTI_GUARDED_BY(mutex_) = true;        // False once stopped: hooks then do nothing.
  std::vector<int> passes_ TUTTI_GUARDED_BY(mutex_);  // Hook firings this round.
  std::vector<std::size_t> unit_of_ TUTTI_GUARDED_BY(mutex_);  // Per named parameter.
  std::vector<UnitState> units_ TUTTI_GUARDED_BY(mutex_);
  std::optional<bool> included_ TUTTI_GUARDED_BY(mutex_);          // Asked at the first reduction.
  bool synchronized_explicitly_ TUTTI_GUARDED_BY(mutex_) = false;  // Since the last step().
  bool warned_ TUTTI_GUARDED_BY(mutex_) = false;
  // What failed the last round; empty while none blocks (Note [A failed round]).
  std::string failure_ TUTTI_GUARDED_BY(mutex_);
  // The round failed in a backward pass (Note [A pass that failed]), for the messages.
  bool failed_pass_ TUTTI_GUARDED_BY(mutex_) = false;
  // refuse_pass() let the round go on; the failed-pass hooks of the walk it stopped do nothing.
  // Cleared by the next hook, step() or zero_grad().
  bool refused_in_flight_ TUTTI_GUARDED_BY(mutex_) = false;
};

}  // namespace tutti::optim::internal
