// SPDX-License-Identifier: Apache-2.0
// DistributedOptimizer: per-parameter grad hooks that start gradient allreduces mid-backward,
// and the round bookkeeping (backward passes, groups, synchronize, step) around them.
#include "tutti/optim/distributed_optimizer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "optimizers/optim_util.h"
#include "src/common/mutex.h"
#include "tutti/half.h"
#include "tutti/runtime.h"

namespace tutti::optim {

// Note [Reduction rounds]
// A round runs from one step() to the next. Within it every reduction unit (a parameter, or a
// group of parameters reduced together) goes Idle -> InFlight -> Done exactly once:
//  1. Each hook firing counts a backward pass of its parameter. The k-th pass
//     (k = backward_passes_per_step) makes the parameter ready; when every member of its unit
//     is ready, the unit's allreduce is started from the hook: communication overlaps the rest
//     of backward(). What travels is given in Note [Gradient buffers].
//  2. synchronize() starts every unit still Idle (parameters whose hook fired fewer than k
//     times, or never, e.g. unused on this rank), so each rank submits every name once per
//     round and no rank waits forever; then it waits for all units and copies each result
//     back into grad(). A second synchronize() finds every unit Done and does nothing, which
//     is why step() after an explicit synchronize() does not reduce twice.
//  3. step() runs the inner optimizer and resets every unit to Idle and the counters to zero.
// A hook firing for a parameter that already made k passes, or whose unit already left Idle,
// is a (k+1)-th backward before step() and throws InvalidArgument from backward(). The
// decision to start a unit depends only on this rank's hooks, but the set of names each rank
// submits per round is the same (all units), which is what name-matched negotiation needs.

// Note [Gradient buffers]
// Without compression a gradient is reduced where it lies, with no copy: start() swaps the
// gradient tensor out of its parameter for the unit's spare tensor of the same shape (a
// handle swap; tensors share storage), the runtime averages the gradient's storage in place,
// and finish() swaps it back, so after synchronize() grad() is the same storage as before,
// now reduced. Meanwhile the parameter holds the spare: a refused extra backward() pass adds
// into it, and nothing reads it. With FP16/BF16 compression the gradient is converted into
// the unit's buffer, which is reduced and converted back.
// A failed reduction (a mismatch, a stall, shutdown: errors found before data moves) leaves
// every gradient as it was. step() inside skip_synchronize() without a synchronize() first
// waits for the reductions the hooks started and applies them, as Horovod's in-place
// reductions of p.grad would.

struct DistributedOptimizer::State {
  enum class Phase { Idle, InFlight, Done };

  // One allreduce: a single parameter or a group.
  struct Unit {
    std::string name;                  // The op name, identical on every rank.
    std::vector<std::size_t> members;  // Indices into params.
    bool grouped = false;              // grouped_allreduce_async even for one member.
    std::size_t ready = 0;             // Members that made their k-th pass this round.
    Phase phase = Phase::Idle;
    Handle handle;
    // Per member, what travels (Note [Gradient buffers]): while in flight, the gradient itself
    // (uncompressed) or its compressed copy; otherwise the spare (uncompressed) or the buffer.
    std::vector<Tensor> buffers;
  };

  // Hooks run on the backward() thread, the methods on the caller's: the mutable state below
  // is guarded. `options`, `params`, `names` and `unit_of` are fixed by the constructor.
  detail::Mutex mutex;
  bool alive TUTTI_GUARDED_BY(mutex) = true;  // False once destroyed: hooks then do nothing.
  DistributedOptions options;
  std::vector<nn::Variable> params;  // The inner optimizer's.
  std::vector<std::string> names;    // Per parameter; empty for those without a gradient.
  std::vector<int> passes TUTTI_GUARDED_BY(mutex);  // Hook firings this round, per parameter.
  std::vector<std::size_t> unit_of;                 // Per trainable parameter: its unit.
  std::vector<Unit> units TUTTI_GUARDED_BY(mutex);
  std::optional<bool> included TUTTI_GUARDED_BY(mutex);  // Asked at the first reduction.

  bool is_member() TUTTI_REQUIRES(mutex) {
    if (!included) included = options.process_set.included();
    return *included;
  }

  ReduceOptions reduce_options() const {
    ReduceOptions ro{.op = options.op, .process_set = options.process_set};
    if (options.op == ReduceOp::Average && options.gradient_predivide_factor != 1.0) {
      // Horovod's split: sum of x/f, then times f/size (Average divides by the size).
      ro.prescale_factor = 1.0 / options.gradient_predivide_factor;
      ro.postscale_factor = options.gradient_predivide_factor;
    }
    return ro;
  }

  DataType wire_type() const {
    switch (options.compression) {
      case Compression::FP16: return DataType::Float16;
      case Compression::BF16: return DataType::BFloat16;
      case Compression::None: break;
    }
    return DataType::Float32;
  }

  bool compressed() const { return options.compression != Compression::None; }

  // Starts the unit's allreduce on its members' gradients, swapped out of the parameters or
  // compressed into the buffers (Note [Gradient buffers]). On a throw (e.g. the runtime is
  // down) the unit stays Idle and every gradient in place.
  void start(Unit& unit) TUTTI_REQUIRES(mutex) {
    unit.buffers.resize(unit.members.size());
    std::vector<TensorView> views;
    for (std::size_t m = 0; m < unit.members.size(); ++m) {
      const Tensor& grad = params[unit.members[m]].grad();
      Tensor& buffer = unit.buffers[m];
      if (buffer.dtype() != wire_type() || buffer.shape() != grad.shape() ||
          buffer.data() == nullptr) {
        buffer = Tensor(wire_type(), grad.shape());
      }
      if (compressed()) pack(grad, buffer);
      views.push_back(compressed() ? buffer.view() : grad.view());
    }
    if (unit.grouped) {
      unit.handle = grouped_allreduce_async(std::move(views), unit.name, reduce_options());
    } else {
      unit.handle = allreduce_async(views.front(), unit.name, reduce_options());
    }
    if (!compressed()) swap_gradients(unit);
    unit.phase = Phase::InFlight;
  }

  // Exchanges the members' gradients with the unit's spares: out of the parameters at the
  // start of a reduction, back in at its end.
  void swap_gradients(Unit& unit) TUTTI_REQUIRES(mutex) {
    for (std::size_t m = 0; m < unit.members.size(); ++m) {
      std::swap(params[unit.members[m]].grad(), unit.buffers[m]);
    }
  }

  // Puts a completed unit's results into the gradients; without `write_results` (a failure,
  // or an optimizer being destroyed) gradients get their own storage back, whatever it holds,
  // and compressed results are dropped.
  void finish(Unit& unit, bool write_results) TUTTI_REQUIRES(mutex) {
    if (!compressed()) {
      swap_gradients(unit);
    } else if (write_results) {
      for (std::size_t m = 0; m < unit.members.size(); ++m) {
        unpack(unit.buffers[m], params[unit.members[m]].grad());
      }
    }
    unit.phase = Phase::Done;
  }

  // Waits for every unit in flight and, with `write_results`, writes their results into the
  // gradients if all succeeded (on a failure every gradient keeps its local value, so a step
  // never mixes averaged and local gradients). Every gradient is back in its parameter
  // afterwards (Note [Gradient buffers]). Returns the first error, after waiting for all
  // (their buffers must not be reused while in flight).
  std::exception_ptr wait_all(bool write_results) TUTTI_REQUIRES(mutex) {
    std::vector<Handle> handles;
    std::vector<Unit*> in_flight;
    for (Unit& unit : units) {
      if (unit.phase != Phase::InFlight) continue;
      handles.push_back(unit.handle);
      in_flight.push_back(&unit);
    }
    std::exception_ptr error;
    try {
      tutti::wait_all(handles);
    } catch (...) {
      error = std::current_exception();
    }
    for (Unit* unit : in_flight) finish(*unit, write_results && !error);
    return error;
  }

  void add_unit(std::string name, std::vector<std::size_t> members, bool grouped)
      TUTTI_REQUIRES(mutex) {
    for (std::size_t m : members) unit_of[m] = units.size();
    Unit unit;
    unit.name = std::move(name);
    unit.members = std::move(members);
    unit.grouped = grouped;
    units.push_back(std::move(unit));
  }

  bool any_in_flight() const TUTTI_REQUIRES(mutex) {
    for (const Unit& unit : units) {
      if (unit.phase == Phase::InFlight) return true;
    }
    return false;
  }

  void new_round() TUTTI_REQUIRES(mutex) {
    std::fill(passes.begin(), passes.end(), 0);
    for (Unit& unit : units) {
      unit.ready = 0;
      unit.phase = Phase::Idle;
    }
  }

  // The hook of parameter `index`. Runs on the backward() thread. See Note [Reduction rounds].
  void on_gradient(std::size_t index) TUTTI_EXCLUDES(mutex) {
    detail::MutexLock lock(mutex);
    if (!alive || !is_member()) return;
    Unit& unit = units[unit_of[index]];
    const int k = options.backward_passes_per_step;
    if (passes[index] >= k) {
      detail::throw_invalid_argument("DistributedOptimizer: backward() ran ", passes[index] + 1,
                                     " times before step() (gradient of '", names[index],
                                     "'), but backward_passes_per_step is ", k,
                                     "; call step() after every ", k,
                                     " backward passes or raise backward_passes_per_step");
    }
    if (unit.phase != Phase::Idle) {
      detail::throw_invalid_argument(
          "DistributedOptimizer: backward() after synchronize() and before step() (gradient of '",
          names[index], "'); the gradients of this step are already reduced");
    }
    if (++passes[index] < k) return;
    if (++unit.ready == unit.members.size()) start(unit);
  }

  // Horovod's synchronize(); see Note [Reduction rounds].
  void synchronize() TUTTI_EXCLUDES(mutex) {
    detail::MutexLock lock(mutex);
    if (units.empty() || !is_member()) return;  // No parameter: nothing to ask the runtime.
    std::exception_ptr first_error;
    for (Unit& unit : units) {
      if (unit.phase != Phase::Idle) continue;
      try {
        start(unit);
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    std::exception_ptr wait_error = wait_all(/*write_results=*/true);
    if (!first_error) first_error = wait_error;
    if (first_error) std::rethrow_exception(first_error);
  }

  static void pack(const Tensor& grad, Tensor& buffer) {
    const std::span<const float> from = grad.span<float>();
    switch (buffer.dtype()) {
      case DataType::Float16: {
        const std::span<float16> to = buffer.span<float16>();
        for (std::size_t i = 0; i < from.size(); ++i) to[i] = float16(from[i]);
        return;
      }
      case DataType::BFloat16: {
        const std::span<bfloat16> to = buffer.span<bfloat16>();
        for (std::size_t i = 0; i < from.size(); ++i) to[i] = bfloat16(from[i]);
        return;
      }
      default:
        if (!from.empty()) std::memcpy(buffer.data(), from.data(), from.size_bytes());
        return;
    }
  }

  static void unpack(const Tensor& buffer, Tensor& grad) {
    const std::span<float> to = grad.span<float>();
    switch (buffer.dtype()) {
      case DataType::Float16: {
        const std::span<float16> from = buffer.span<float16>();
        for (std::size_t i = 0; i < to.size(); ++i) to[i] = static_cast<float>(from[i]);
        return;
      }
      case DataType::BFloat16: {
        const std::span<bfloat16> from = buffer.span<bfloat16>();
        for (std::size_t i = 0; i < to.size(); ++i) to[i] = static_cast<float>(from[i]);
        return;
      }
      default:
        if (!to.empty()) std::memcpy(to.data(), buffer.data(), to.size_bytes());
        return;
    }
  }
};

namespace {

void check_options(const DistributedOptions& o) {
  if (o.op != ReduceOp::Average && o.op != ReduceOp::Sum && o.op != ReduceOp::Adasum) {
    detail::throw_invalid_argument("DistributedOptimizer: op must be Average, Sum or Adasum, got ",
                                   static_cast<int>(o.op));
  }
  if (o.compression != Compression::None && o.compression != Compression::FP16 &&
      o.compression != Compression::BF16) {
    detail::throw_invalid_argument("DistributedOptimizer: unknown compression ",
                                   static_cast<int>(o.compression));
  }
  if (o.backward_passes_per_step < 1) {
    detail::throw_invalid_argument(
        "DistributedOptimizer: backward_passes_per_step must be at least 1, got ",
        o.backward_passes_per_step);
  }
  if (!(o.gradient_predivide_factor > 0) || !std::isfinite(o.gradient_predivide_factor)) {
    detail::throw_invalid_argument(
        "DistributedOptimizer: gradient_predivide_factor must be a positive number, got ",
        o.gradient_predivide_factor);
  }
  if (o.gradient_predivide_factor != 1.0 && o.op != ReduceOp::Average) {
    detail::throw_invalid_argument("DistributedOptimizer: gradient_predivide_factor ",
                                   o.gradient_predivide_factor, " needs op Average");
  }
  if (o.num_groups < 0) {
    detail::throw_invalid_argument("DistributedOptimizer: num_groups must be >= 0, got ",
                                   o.num_groups);
  }
  if (o.num_groups > 0 && !o.groups.empty()) {
    detail::throw_invalid_argument("DistributedOptimizer: give num_groups or groups, not both");
  }
}

// Writes one whole line to stderr with a single write(2), so ranks' lines do not interleave.
void warn_line(const std::string& message) {
  std::string line = "[tutti";
  if (is_initialized()) line += " rank " + std::to_string(rank());
  line += "] WARNING: " + message + "\n";
  // Best effort: a warning that cannot be written is not worth failing a training step.
  static_cast<void>(::write(STDERR_FILENO, line.data(), line.size()));
}

}  // namespace

// `named_parameters` is taken by value as API.md declares it.
DistributedOptimizer::DistributedOptimizer(
    Optimizer& inner,
    nn::NamedParameters named_parameters,  // NOLINT(performance-unnecessary-value-param)
    DistributedOptions options)
    : Optimizer(inner.parameters()), inner_(inner), state_(std::make_shared<State>()) {
  check_options(options);
  State& s = *state_;
  s.options = std::move(options);
  s.params = parameters();
  const std::size_t n = s.params.size();

  // Parameters are identified by the address of their value tensor, which lives in the shared
  // Variable state: copies of a Variable agree, distinct Variables differ.
  std::map<const Tensor*, std::size_t> index_of;
  for (std::size_t i = 0; i < n; ++i) {
    if (!index_of.emplace(&s.params[i].value(), i).second) {
      detail::throw_invalid_argument("DistributedOptimizer: parameter ", i,
                                     " of the optimizer repeats parameter ",
                                     index_of[&s.params[i].value()]);
    }
  }

  s.names.assign(n, {});
  if (named_parameters.empty()) {
    for (std::size_t i = 0; i < n; ++i) s.names[i] = "noname." + std::to_string(i);
  } else {
    std::set<std::string> seen;
    for (const auto& [name, variable] : named_parameters) {
      if (!seen.insert(name).second) {
        detail::throw_invalid_argument("DistributedOptimizer: parameter name '", name,
                                       "' appears more than once in named_parameters");
      }
      if (!variable.defined()) {
        detail::throw_invalid_argument("DistributedOptimizer: parameter '", name,
                                       "' is an empty nn::Variable");
      }
      const auto it = index_of.find(&variable.value());
      if (it != index_of.end() && s.names[it->second].empty()) s.names[it->second] = name;
    }
  }

  std::vector<std::size_t> trainable;
  for (std::size_t i = 0; i < n; ++i) {
    if (!internal::trainable(s.params[i])) {
      s.names[i].clear();  // Never reduced: see the header.
      continue;
    }
    if (s.names[i].empty()) {
      detail::throw_invalid_argument(
          "DistributedOptimizer: parameter ", i, " of the optimizer (shape ",
          detail::shape_string(s.params[i].value().shape()),
          ") has no name in named_parameters; the names must cover every "
          "parameter");
    }
    trainable.push_back(i);
  }

  // Units; see Note [Reduction rounds]. No hook is registered yet, but the analysis wants
  // the guarded members written under their lock.
  detail::MutexLock lock(s.mutex);
  s.unit_of.assign(n, 0);
  const std::string group_prefix = "DistributedOptimizer.grouped_allreduce.";
  std::vector<bool> grouped(n, false);
  if (s.options.num_groups > 0 && !trainable.empty()) {
    // Contiguous, nearly equal groups, the first `extra` one larger (numpy's array_split).
    const std::size_t count =
        std::min<std::size_t>(static_cast<std::size_t>(s.options.num_groups), trainable.size());
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
      s.add_unit(group_prefix + std::to_string(g), std::move(members), true);
    }
  } else if (!s.options.groups.empty()) {
    std::map<std::string, std::size_t> by_name;
    for (std::size_t i : trainable) by_name.emplace(s.names[i], i);
    for (std::size_t g = 0; g < s.options.groups.size(); ++g) {
      const std::vector<std::string>& group = s.options.groups[g];
      if (group.empty())
        detail::throw_invalid_argument("DistributedOptimizer: group ", g, " is empty");
      std::vector<std::size_t> members;
      for (const std::string& name : group) {
        const auto it = by_name.find(name);
        if (it == by_name.end()) {
          detail::throw_invalid_argument("DistributedOptimizer: group ", g, " names '", name,
                                         "', which is not a parameter of the optimizer");
        }
        if (grouped[it->second]) {
          detail::throw_invalid_argument("DistributedOptimizer: parameter '", name,
                                         "' appears more than once in groups");
        }
        grouped[it->second] = true;
        members.push_back(it->second);
      }
      s.add_unit(group_prefix + std::to_string(g), std::move(members), true);
    }
  }
  for (std::size_t i : trainable) {
    if (!grouped[i]) s.add_unit("DistributedOptimizer.allreduce." + s.names[i], {i}, false);
  }
  s.passes.assign(n, 0);

  // The hooks hold the state weakly: after the optimizer is gone they find nothing to do.
  const std::weak_ptr<State> weak = state_;
  for (std::size_t i : trainable) {
    s.params[i].register_grad_hook([weak, i](nn::Variable&) {
      if (const std::shared_ptr<State> state = weak.lock()) state->on_gradient(i);
    });
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  detail::MutexLock lock(state_->mutex);
  state_->alive = false;
  // The runtime may still read and write the buffers: wait, and drop errors (destructors
  // never fail; step()/synchronize() are where errors are reported).
  static_cast<void>(state_->wait_all(/*write_results=*/false));
}

void DistributedOptimizer::synchronize() {
  synchronized_explicitly_ = true;
  state_->synchronize();
}

void DistributedOptimizer::step() {
  if (skip_depth_ == 0) {
    if (synchronized_explicitly_ && !warned_) {
      warned_ = true;
      warn_line(
          "DistributedOptimizer: step() called without skip_synchronize() after an explicit "
          "synchronize(); the gradients are not reduced twice, but wrap step() in "
          "`auto guard = optimizer.skip_synchronize();` (warned once per optimizer)");
    }
    state_->synchronize();
  } else {
    // Reductions the hooks started are finished and applied (their buffers and names must be
    // free for the next round; see Note [Gradient buffers]).
    detail::MutexLock lock(state_->mutex);
    if (std::exception_ptr error = state_->wait_all(/*write_results=*/true)) {
      std::rethrow_exception(error);
    }
  }
  inner_.step();
  {
    detail::MutexLock lock(state_->mutex);
    state_->new_round();
  }
  synchronized_explicitly_ = false;
}

void DistributedOptimizer::zero_grad() {
  {
    detail::MutexLock lock(state_->mutex);
    if (state_->any_in_flight()) {
      detail::throw_invalid_argument(
          "DistributedOptimizer::zero_grad() while gradient allreduces are "
          "in flight (after backward(), before step() or synchronize()); "
          "their results would overwrite the zeros");
    }
  }
  inner_.zero_grad();
}

StateDict DistributedOptimizer::state_dict() const { return inner_.state_dict(); }

void DistributedOptimizer::load_state_dict(const StateDict& state) {
  inner_.load_state_dict(state);
}

}  // namespace tutti::optim
