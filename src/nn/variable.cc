// SPDX-License-Identifier: Apache-2.0
// nn::Variable and the backward pass over the walk of src/nn/backward_walk.cc, which fires each
// leaf's hooks the moment its gradient is complete (Note [Hook timing] there).
#include "tutti/nn/variable.h"

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/nn/autograd.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

// Note [Thread safety of nn]
// DataParallel runs one module's forward on several threads at once, and users may run backward
// passes on several threads over graphs that share parameters. What makes that safe:
//  - Operations only read their inputs' values and make new nodes; sequence numbers are atomic.
//    The two layers with side effects lock: BatchNorm's running-statistics update
//    (src/nn/batch_norm.cc) and the generator behind initialization and Dropout
//    (src/nn/random.cc).
//  - Each walk (src/nn/backward_walk.cc) keeps its use counts and pending gradients to
//    itself; the only shared state it writes is a leaf's grad(), added to under the leaf's
//    grad_mutex. Hooks run on the thread whose walk completed the leaf, so a leaf shared by
//    concurrent passes may run its hooks concurrently: hooks must then be thread-safe.
// Not safe, and not locked: writing values or grad() (optimizer steps, zero_grad()) while a pass
// over those leaves runs; registering hooks, parameters, buffers or modules, train() and
// manual_seed() concurrently with anything that uses the same objects; reading a grad() while a
// concurrent pass adds to it.

namespace detail {
namespace {

// Results are numbered in creation order; see Note [Hook timing] in src/nn/backward_walk.cc.
std::atomic<std::uint64_t> next_sequence{1};

// Adds `contribution` (float32, of the leaf's shape) into the leaf's grad() `total` in place.
// grad() is writable, so `total` may be anything: an empty tensor has the shape of a scalar
// ([]) and another dtype the right shape, and neither may be written as floats.
void accumulate(Tensor& total, const Tensor& contribution) {
  if (total.data() == nullptr) {
    throw_invalid_argument("a leaf's grad() is an empty tensor but its gradient has shape ",
                           shape_string(contribution.shape()),
                           "; grad() must keep the value's shape");
  }
  if (total.shape() != contribution.shape()) {
    throw_invalid_argument("a leaf's grad() has shape ", shape_string(total.shape()),
                           " but its gradient has shape ", shape_string(contribution.shape()),
                           "; grad() must keep the value's shape");
  }
  if (total.dtype() != DataType::Float32 || total.device().kind != Device::Kind::CPU) {
    throw_invalid_argument("a leaf's grad() is a ", to_string(total.dtype()),
                           total.device().kind == Device::Kind::CPU ? " CPU" : " CUDA",
                           " tensor; it must stay float32 on the CPU");
  }
  as_array(total) += as_array(contribution);
}

void fire_hooks(const std::shared_ptr<VariableImpl>& leaf) {
  if (leaf->hooks.empty()) return;
  Variable handle = VariableAccess::wrap(leaf);
  // A copy: a hook that registers another hook must not invalidate this loop.
  const std::vector<std::function<void(Variable&)>> hooks = leaf->hooks;
  for (const auto& hook : hooks) hook(handle);
}

// Note [A walk that throws] in src/nn/backward_walk.cc: what the node's failed-pass hooks throw
// is dropped, since backward() rethrows the walk's own error and every hook must run.
void fire_failed_pass_hooks(const std::shared_ptr<VariableImpl>& node) {
  if (node->failed_pass_hooks.empty()) return;
  Variable handle = VariableAccess::wrap(node);
  const std::vector<std::function<void(Variable&)>> hooks = node->failed_pass_hooks;
  for (const auto& hook : hooks) {
    try {
      hook(handle);
    } catch (...) {  // Dropped: see above.
    }
  }
}

// Where a walk puts the leaves' contributions: into grad(), under the leaf's lock, firing the
// hooks once complete and the failed-pass hooks if the walk throws (backward()), or into
// `capture` (leaf_gradients()). See Note [Thread safety of nn].
LeafDelivery delivery(LeafGradients* capture) {
  if (capture != nullptr) {
    return {.contribute =
                [capture](const std::shared_ptr<VariableImpl>& leaf, Tensor contribution) {
                  add_contribution(*capture, leaf.get(), std::move(contribution));
                },
            .complete = {},
            .abandoned = {}};
  }
  return {.contribute =
              [](const std::shared_ptr<VariableImpl>& leaf, Tensor contribution) {
                const tutti::detail::MutexLock lock(leaf->grad_mutex);
                accumulate(leaf->grad, contribution);
              },
          .complete = fire_hooks,
          .abandoned = fire_failed_pass_hooks};
}

// Note [Backward callbacks]
// DistributedDataParallel must wait for its bucket allreduces and write the averages into grad()
// before backward() returns, and only backward() knows when the last gradient is done. So each
// backward() installs, for its thread, a list that hooks and backward functions append to
// (queue_backward_callback()); once the walk has propagated every gradient, the callbacks run in
// the order queued (ones queued by a callback run too), all of them even if one throws, and the
// first exception is rethrown from backward(). If the walk itself throws (a hook, a grad() of
// the wrong shape), the callbacks run all the same and the walk's exception is rethrown, theirs
// dropped: DDP's must start the buckets this rank has not, or the other ranks, whose passes
// wait in them, would finish theirs only with this rank's next pass, a step apart. The walk's
// failed-pass hooks (Note [A walk that throws] in src/nn/backward_walk.cc) run before the
// callbacks, so they may queue some. The list is per thread and per call, so a backward()
// started by a hook (a nested pass) has its own, and leaf_gradients() walks, which fire no
// hooks, have none.

// The callback list of the innermost backward() running on this thread, or null.
thread_local std::vector<std::function<void()>>* current_callbacks = nullptr;

// Installs a backward() call's callback list for this thread; restores the outer one after.
class CallbackScope {
 public:
  explicit CallbackScope(std::vector<std::function<void()>>* list) : outer_(current_callbacks) {
    current_callbacks = list;
  }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;
  ~CallbackScope() { current_callbacks = outer_; }

 private:
  std::vector<std::function<void()>>* outer_;
};

// backward(): the walk from a scalar root with gradient one, then the queued callbacks.
void run_backward_pass(const std::shared_ptr<VariableImpl>& root) {
  std::vector<std::function<void()>> callbacks;
  const CallbackScope scope(&callbacks);
  Tensor seed = zeros(root->value.shape());
  as_array(seed).setOnes();
  std::exception_ptr walk_error;
  try {
    walk_backward({{.node = root, .gradient = std::move(seed)}}, delivery(nullptr));
  } catch (...) {
    walk_error = std::current_exception();
  }
  std::exception_ptr first_error = walk_error;
  for (std::size_t i = 0; i < callbacks.size(); ++i) {  // Index: callbacks may append.
    const std::function<void()> callback = std::move(callbacks[i]);
    try {
      callback();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

// The node behind `impl`, or InvalidArgument for an empty Variable.
VariableImpl& checked(const std::shared_ptr<VariableImpl>& impl) {
  if (!impl) throw_invalid_argument("nn::Variable is empty: assign it before use");
  return *impl;
}

// Appends `hook` to the leaf's list `list` (grad hooks or failed-pass hooks); `who` names the
// public call in the InvalidArgument for an empty Variable, a result, a leaf that does not
// require grad, or an empty hook.
void add_leaf_hook(const std::shared_ptr<VariableImpl>& impl, std::function<void(Variable&)> hook,
                   std::vector<std::function<void(Variable&)>> VariableImpl::*list,
                   const char* who) {
  VariableImpl& node = checked(impl);
  if (!node.is_leaf() || !node.requires_grad) {
    throw_invalid_argument(who, "() needs a leaf Variable that requires grad (a parameter)");
  }
  if (!hook) throw_invalid_argument(who, "() got an empty hook");
  (node.*list).push_back(std::move(hook));
}

}  // namespace

Variable make_result(Tensor value, const std::vector<Variable>& inputs, BackwardFunction backward) {
  Variable result(std::move(value));
  bool any_requires_grad = false;
  for (const Variable& input : inputs) any_requires_grad |= input.requires_grad();
  if (!any_requires_grad) return result;
  VariableImpl& node = *VariableAccess::impl(result);
  node.requires_grad = true;
  node.sequence = next_sequence.fetch_add(1, std::memory_order_relaxed);
  node.inputs.reserve(inputs.size());
  for (const Variable& input : inputs) node.inputs.push_back(VariableAccess::impl(input));
  node.backward = std::move(backward);
  return result;
}

std::uint64_t next_result_sequence() {
  return next_sequence.fetch_add(1, std::memory_order_relaxed);
}

bool queue_backward_callback(std::function<void()> callback) {
  if (current_callbacks == nullptr) return false;
  current_callbacks->push_back(std::move(callback));
  return true;
}

LeafGradients leaf_gradients(const Variable& root, const Tensor& grad_root) {
  const std::shared_ptr<VariableImpl>& node = VariableAccess::impl(root);
  checked(node);
  if (grad_root.shape() != node->value.shape()) {
    throw_invalid_argument("leaf_gradients: the gradient has shape ",
                           shape_string(grad_root.shape()), " but the root has shape ",
                           shape_string(node->value.shape()));
  }
  LeafGradients gradients;
  if (node->requires_grad)
    walk_backward({{.node = node, .gradient = grad_root}}, delivery(&gradients));
  return gradients;
}

std::vector<std::shared_ptr<VariableImpl>> reachable_leaves(const Variable& root) {
  const std::shared_ptr<VariableImpl>& node = VariableAccess::impl(root);
  std::vector<std::shared_ptr<VariableImpl>> leaves;
  if (!checked(node).requires_grad) return leaves;
  std::unordered_set<VariableImpl*> seen{node.get()};
  std::vector<std::shared_ptr<VariableImpl>> to_visit{node};
  while (!to_visit.empty()) {
    std::shared_ptr<VariableImpl> current = std::move(to_visit.back());
    to_visit.pop_back();
    if (current->is_leaf()) {
      leaves.push_back(std::move(current));
      continue;
    }
    for (const std::shared_ptr<VariableImpl>& input : current->inputs) {
      if (input->requires_grad && seen.insert(input.get()).second) to_visit.push_back(input);
    }
  }
  return leaves;
}

void enable_grad(const Variable& v) {
  VariableImpl& node = checked(VariableAccess::impl(v));
  if (!node.is_leaf()) {
    throw_invalid_argument(
        "requires_grad can be turned on only for a leaf Variable, not for "
        "the result of an operation");
  }
  if (node.requires_grad) return;
  node.requires_grad = true;
  node.grad = zeros(node.value.shape());
}

}  // namespace detail

Variable::Variable(Tensor value, bool requires_grad) {
  if (value.dtype() != DataType::Float32 || value.device().kind != Device::Kind::CPU) {
    detail::throw_invalid_argument("nn::Variable holds float32 CPU tensors, got a ",
                                   to_string(value.dtype()), " tensor on ",
                                   value.device().kind == Device::Kind::CPU ? "the CPU" : "CUDA");
  }
  if (value.data() == nullptr) {
    detail::throw_invalid_argument("nn::Variable got a default-constructed (empty) Tensor");
  }
  impl_ = std::make_shared<detail::VariableImpl>();
  impl_->value = std::move(value);
  if (requires_grad) detail::enable_grad(*this);
}

const Tensor& Variable::value() const { return detail::checked(impl_).value; }
Tensor& Variable::value() { return detail::checked(impl_).value; }
const Tensor& Variable::grad() const { return detail::checked(impl_).grad; }
Tensor& Variable::grad() { return detail::checked(impl_).grad; }
bool Variable::requires_grad() const { return detail::checked(impl_).requires_grad; }

void Variable::set_requires_grad(bool on) {
  detail::VariableImpl& node = detail::checked(impl_);
  if (!node.is_leaf()) {
    detail::throw_invalid_argument(
        "set_requires_grad() needs a leaf Variable (a parameter), not the result of an "
        "operation");
  }
  if (on) {
    detail::enable_grad(*this);
    return;
  }
  // The walk reads the flag as it goes (backward_walk.cc): a graph recorded before still runs,
  // without this leaf. No gradient is kept, as for any Variable that does not require grad.
  node.requires_grad = false;
  node.grad = Tensor();
}
bool Variable::defined() const { return impl_ != nullptr; }
bool Variable::is_leaf() const { return impl_ != nullptr && impl_->is_leaf(); }

void Variable::backward() {
  const detail::VariableImpl& root = detail::checked(impl_);
  if (root.value.num_elements() != 1) {
    detail::throw_invalid_argument("backward() needs a Variable with one element, got shape ",
                                   detail::shape_string(root.value.shape()));
  }
  if (!root.requires_grad) {
    detail::throw_invalid_argument(
        "backward() on a Variable that does not require grad: no "
        "leaf it was computed from requires grad");
  }
  detail::run_backward_pass(impl_);
}

void Variable::register_grad_hook(std::function<void(Variable&)> hook) {
  detail::add_leaf_hook(impl_, std::move(hook), &detail::VariableImpl::hooks, "register_grad_hook");
}

void Variable::register_failed_pass_hook(std::function<void(Variable&)> hook) {
  detail::add_leaf_hook(impl_, std::move(hook), &detail::VariableImpl::failed_pass_hooks,
                        "register_failed_pass_hook");
}

}  // namespace tutti::nn
