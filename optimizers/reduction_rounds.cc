// SPDX-License-Identifier: Apache-2.0
// The reduction engine of the distributed optimizers: see Note [Reduction rounds] in
// optimizers/reduction_rounds.h.
#include "optimizers/reduction_rounds.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/common/throw.h"
#include "tutti/runtime.h"

namespace tutti::optim::internal {
namespace {

// Writes one whole line to stderr with a single write(2), so ranks' lines do not interleave.
void warn_line(const std::string& message) {
  std::string line = "[tutti";
  if (is_initialized()) line += " rank " + std::to_string(rank());
  line += "] WARNING: " + message + "\n";
  // Best effort: a warning that cannot be written is not worth failing a training step.
  static_cast<void>(::write(STDERR_FILENO, line.data(), line.size()));
}

// The message of a failure rethrown from `error`, for the errors that name it later.
std::string error_text(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown error";
  }
}

}  // namespace

void check_options(const DistributedOptions& o, const char* who) {
  if (o.op != ReduceOp::Average && o.op != ReduceOp::Sum && o.op != ReduceOp::Adasum) {
    detail::throw_invalid_argument(who, ": op must be Average, Sum or Adasum, got ",
                                   to_string(o.op));
  }
  if (o.compression != Compression::None && o.compression != Compression::FP16 &&
      o.compression != Compression::BF16) {
    detail::throw_invalid_argument(who, ": unknown compression ", static_cast<int>(o.compression));
  }
  if (o.backward_passes_per_step < 1) {
    detail::throw_invalid_argument(who, ": backward_passes_per_step must be at least 1, got ",
                                   o.backward_passes_per_step);
  }
  if (!(o.gradient_predivide_factor > 0) || !std::isfinite(o.gradient_predivide_factor)) {
    detail::throw_invalid_argument(who,
                                   ": gradient_predivide_factor must be a positive number, got ",
                                   o.gradient_predivide_factor);
  }
  if (o.gradient_predivide_factor != 1.0 && o.op != ReduceOp::Average) {
    detail::throw_invalid_argument(who, ": gradient_predivide_factor ", o.gradient_predivide_factor,
                                   " needs op Average");
  }
  if (o.num_groups < 0) {
    detail::throw_invalid_argument(who, ": num_groups must be >= 0, got ", o.num_groups);
  }
  if (o.num_groups > 0 && !o.groups.empty()) {
    detail::throw_invalid_argument(who, ": give num_groups or groups, not both");
  }
}

void refuse_frozen_in_groups(const DistributedOptions& options, const std::set<std::string>& frozen,
                             const char* who) {
  for (std::size_t g = 0; g < options.groups.size(); ++g) {
    for (const std::string& name : options.groups[g]) {
      if (frozen.contains(name)) {
        detail::throw_invalid_argument(
            who, ": group ", g, " names '", name,
            "', a frozen parameter (requires_grad is false): it has no gradient to reduce; "
            "leave it out of groups");
      }
    }
  }
}

ReduceOptions reduce_options(const DistributedOptions& options) {
  ReduceOptions result{.op = options.op, .process_set = options.process_set};
  if (options.op == ReduceOp::Average && options.gradient_predivide_factor != 1.0) {
    // Horovod's split: sum of x/f, then times f/size (Average divides by the size).
    result.prescale_factor = 1.0 / options.gradient_predivide_factor;
    result.postscale_factor = options.gradient_predivide_factor;
  }
  return result;
}

ReductionRounds::ReductionRounds(DistributedOptions options, std::vector<std::string> names,
                                 GradientBuffers& buffers, const char* who)
    : options_((check_options(options, who), std::move(options))),
      reduce_options_(reduce_options(options_)),
      names_(std::move(names)),
      buffers_(buffers) {
  // Nothing else sees this object yet, but the analysis wants guarded members written locked.
  const detail::MutexLock lock(mutex_);
  passes_.assign(names_.size(), 0);
  unit_of_.assign(names_.size(), 0);
  build_units(who);
}

void ReductionRounds::add_unit(std::string name, std::vector<std::size_t> members, bool grouped) {
  for (std::size_t m : members) unit_of_[m] = units_.size();
  UnitState state;
  state.unit = {.index = units_.size(),
                .name = std::move(name),
                .members = std::move(members),
                .grouped = grouped};
  units_.push_back(std::move(state));
}

// The units of DistributedOptions::num_groups or ::groups, then every other parameter alone.
void ReductionRounds::build_units(const char* who) {
  std::vector<std::size_t> trainable;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (!names_[i].empty()) trainable.push_back(i);
  }
  // A group is named after its first parameter, as Horovod does: the names are the same on
  // every rank, and two optimizers over disjoint parameters of one model (a body's and a head's,
  // sharing each backward()) reduce under names of their own, which group indices were not.
  const auto group_name = [this](const std::vector<std::size_t>& members) {
    return "DistributedOptimizer.grouped_allreduce." + names_[members.front()];
  };
  std::vector<bool> grouped(names_.size(), false);
  // Options that name no grouping get the job's default (TUTTI_GRADIENT_GROUPING), which is the
  // same on every rank, as the units' names must be.
  const int num_groups = options_.num_groups == 0 && options_.groups.empty()
                             ? tutti::default_gradient_groups()
                             : options_.num_groups;
  if (num_groups > 0 && !trainable.empty()) {
    // Contiguous, nearly equal groups, the first `extra` one larger (numpy's array_split).
    const std::size_t count =
        std::min<std::size_t>(static_cast<std::size_t>(num_groups), trainable.size());
    const std::size_t base = trainable.size() / count;
    const std::size_t extra = trainable.size() % count;
    std::size_t next = 0;
    for (std::size_t g = 0; g < count; ++g) {
      const std::size_t size = base + (g < extra ? 1 : 0);
      std::vector<std::size_t> members(
          trainable.begin() + static_cast<std::ptrdiff_t>(next),
          trainable.begin() + static_cast<std::ptrdiff_t>(next + size));
      next += size;
      for (std::size_t m : members) grouped[m] = true;
      std::string unit_name = group_name(members);  // Before `members` is moved from.
      add_unit(std::move(unit_name), std::move(members), true);
    }
  } else if (!options_.groups.empty()) {
    std::map<std::string, std::size_t> by_name;
    for (std::size_t i : trainable) by_name.emplace(names_[i], i);
    for (std::size_t g = 0; g < options_.groups.size(); ++g) {
      const std::vector<std::string>& group = options_.groups[g];
      if (group.empty()) detail::throw_invalid_argument(who, ": group ", g, " is empty");
      std::vector<std::size_t> members;
      for (const std::string& name : group) {
        const auto it = by_name.find(name);
        if (it == by_name.end()) {
          detail::throw_invalid_argument(who, ": group ", g, " names '", name,
                                         "', which is not a parameter of the optimizer");
        }
        if (grouped[it->second]) {
          detail::throw_invalid_argument(who, ": parameter '", name,
                                         "' appears more than once in groups");
        }
        grouped[it->second] = true;
        members.push_back(it->second);
      }
      std::string unit_name = group_name(members);  // Before `members` is moved from.
      add_unit(std::move(unit_name), std::move(members), true);
    }
  }
  for (std::size_t i : trainable) {
    if (!grouped[i]) add_unit("DistributedOptimizer.allreduce." + names_[i], {i}, false);
  }
}

bool ReductionRounds::is_member() {
  if (!included_) included_ = options_.process_set.included();
  return *included_;
}

void ReductionRounds::start(UnitState& state) {
  state.handle = buffers_.start(state.unit, reduce_options_);
  state.phase = Phase::InFlight;
}

void ReductionRounds::on_gradient(std::size_t index) {
  const detail::MutexLock lock(mutex_);
  if (!alive_ || !is_member()) return;
  refused_in_flight_ = false;  // A new pass.
  check_not_failed("backward()");
  UnitState& state = units_[unit_of_[index]];
  const int k = options_.backward_passes_per_step;
  if (state.phase == Phase::Done) {  // After an explicit synchronize(), whatever the count.
    refuse_pass(
        state,
        detail::str_cat(
            "DistributedOptimizer: backward() after synchronize() and before step() (gradient of '",
            names_[index], "'); the gradients of this step are already reduced"));
  }
  if (passes_[index] >= k) {
    refuse_pass(state, detail::str_cat("DistributedOptimizer: backward() ran ", passes_[index] + 1,
                                       " times before step() (gradient of '", names_[index],
                                       "'), but backward_passes_per_step is ", k,
                                       "; call step() after every ", k,
                                       " backward passes or raise backward_passes_per_step"));
  }
  if (state.phase != Phase::Idle) {  // Started by synchronize() before this member's passes.
    refuse_pass(
        state,
        detail::str_cat(
            "DistributedOptimizer: backward() after synchronize() and before step() (gradient of '",
            names_[index], "'); the gradients of this step are already reduced"));
  }
  if (++passes_[index] < k) return;
  if (++state.ready == state.unit.members.size()) start(state);
}

void ReductionRounds::on_failed_pass() {
  const detail::MutexLock lock(mutex_);
  // A round that failed already owes nothing more; see the Note for refused_in_flight_.
  if (!alive_ || !is_member() || !failure_.empty() || refused_in_flight_) return;
  int sent = 0;
  for (UnitState& state : units_) {
    if (state.phase != Phase::Idle) continue;
    try {
      start(state);
      ++sent;
    } catch (...) {  // Dropped: backward() throws its own error, and the round fails below.
    }
  }
  fail_round(sent == 0 ? std::string("a backward() on this rank threw")
                       : detail::str_cat("a backward() on this rank threw; ", sent,
                                         " reduction(s) it had not started went out with the "
                                         "gradients as they stood"));
  failed_pass_ = true;
}

void ReductionRounds::check_none_in_flight(const char* what) {
  const detail::MutexLock lock(mutex_);
  refused_in_flight_ = false;
  for (const UnitState& state : units_) {
    if (state.phase == Phase::InFlight) {
      detail::throw_invalid_argument(
          what,
          " while gradient allreduces are in flight (after backward(), before step() or "
          "synchronize()); their results would overwrite the zeros");
    }
  }
}

void ReductionRounds::synchronize() {
  const detail::MutexLock lock(mutex_);
  check_not_failed("synchronize()");
  synchronized_explicitly_ = true;
  synchronize_locked();
}

void ReductionRounds::synchronize_locked() {
  if (units_.empty() || !is_member()) return;  // No parameter: nothing to ask the runtime.
  std::exception_ptr first_error;
  for (UnitState& state : units_) {
    if (state.phase != Phase::Idle) continue;
    try {
      start(state);
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  const std::exception_ptr wait_error = wait_all(/*write_results=*/true);
  if (!first_error) first_error = wait_error;
  if (first_error) {
    fail_round(error_text(first_error));
    std::rethrow_exception(first_error);
  }
}

void ReductionRounds::refuse_pass(const UnitState& state, const std::string& why) {
  // The refused pass has already added into the parameter's gradient. While its unit is in
  // flight that is the spare or a gradient the result overwrites, and the round goes on; else
  // it is a gradient this round reduced or will reduce (Note [A failed round]).
  if (state.phase != Phase::InFlight) {
    fail_round(why);
  } else {
    refused_in_flight_ = true;
  }
  detail::throw_invalid_argument(why);
}

void ReductionRounds::fail_round(std::string why) {
  static_cast<void>(wait_all(/*write_results=*/false));
  new_round();
  synchronized_explicitly_ = false;
  failure_ = std::move(why);
}

void ReductionRounds::check_not_failed(const char* what) const {
  if (failure_.empty()) return;
  if (failed_pass_) {
    detail::throw_invalid_argument(
        "DistributedOptimizer: ", what, " after a failed backward pass (", failure_,
        "): the other ranks' step used this rank's reductions, so this rank skips the step; "
        "call zero_grad() and go on with the next step's backward() (repeating this step on "
        "this rank alone would pair its reductions with the others' next step)");
  }
  detail::throw_invalid_argument(
      "DistributedOptimizer: ", what, " after a failed step (", failure_,
      "): the gradients are partly reduced; call zero_grad() and run backward() again");
}

void ReductionRounds::clear_failure() {
  const detail::MutexLock lock(mutex_);
  failure_.clear();
  failed_pass_ = false;
}

// Waits for every unit in flight and, with `write_results`, has the wrapper write their results
// into the gradients if all succeeded. Returns the first error, after waiting for all (their
// buffers must not be reused while in flight).
std::exception_ptr ReductionRounds::wait_all(bool write_results) {
  std::vector<Handle> handles;
  std::vector<UnitState*> in_flight;
  for (UnitState& state : units_) {
    if (state.phase != Phase::InFlight) continue;
    handles.push_back(state.handle);
    in_flight.push_back(&state);
  }
  std::exception_ptr error;
  try {
    tutti::wait_all(handles);
  } catch (...) {
    error = std::current_exception();
  }
  std::exception_ptr finish_error;
  for (UnitState* state : in_flight) {
    std::exception_ptr problem = buffers_.finish(state->unit, write_results && !error);
    if (!finish_error) finish_error = std::move(problem);
    state->phase = Phase::Done;
  }
  return error ? error : finish_error;
}

void ReductionRounds::new_round() {
  refused_in_flight_ = false;
  std::fill(passes_.begin(), passes_.end(), 0);
  for (UnitState& state : units_) {
    state.ready = 0;
    state.phase = Phase::Idle;
  }
}

void ReductionRounds::step(bool skipping, const std::function<void()>& inner_step) {
  {
    const detail::MutexLock lock(mutex_);
    check_not_failed("step()");
    if (!skipping) {
      if (synchronized_explicitly_ && !warned_) {
        warned_ = true;
        warn_line(
            "DistributedOptimizer: step() called without skip_synchronize() after an explicit "
            "synchronize(); the gradients are not reduced twice, but wrap step() in "
            "`auto guard = optimizer.skip_synchronize();` (warned once per optimizer)");
      }
      synchronize_locked();
    } else if (const std::exception_ptr error = wait_all(/*write_results=*/true)) {
      fail_round(error_text(error));
      std::rethrow_exception(error);
    }
  }
  inner_step();
  const detail::MutexLock lock(mutex_);
  new_round();
  synchronized_explicitly_ = false;
}

int ReductionRounds::units_started() const {
  const detail::MutexLock lock(mutex_);
  return static_cast<int>(std::count_if(units_.begin(), units_.end(),
                                        [](const UnitState& s) { return s.phase != Phase::Idle; }));
}

std::size_t ReductionRounds::unit_count() const {
  const detail::MutexLock lock(mutex_);
  return units_.size();
}

void ReductionRounds::stop() {
  const detail::MutexLock lock(mutex_);
  alive_ = false;
  // The runtime may still read and write the buffers: wait, and drop errors (destructors never
  // fail; step()/synchronize() are where errors are reported).
  static_cast<void>(wait_all(/*write_results=*/false));
}

}  // namespace tutti::optim::internal
