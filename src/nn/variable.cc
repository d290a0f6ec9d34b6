// SPDX-License-Identifier: Apache-2.0
// nn::Variable and the backward pass: a topological walk of the recorded graph that fires each
// leaf's hooks the moment its gradient is complete.
#include "tutti/nn/variable.h"

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/nn/autograd.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

// Note [Hook timing]
// The distributed optimizer starts the allreduce of a parameter's gradient from that parameter's
// hook, so a hook must fire as soon as the gradient is final, not when backward() returns:
// the last layer's gradients then travel while the earlier layers are still being
// differentiated. "Final" means every use of the leaf in the graph has contributed, which matters
// when a weight is shared (used twice, its first contribution is not the whole gradient).
//
// backward() therefore works in two steps:
//  1. Count uses. A walk from the root over the nodes that require grad counts, for every node,
//     the edges into it (a node used twice by one op, as in x * x, counts twice).
//  2. Propagate in topological order (Kahn's algorithm). A result is ready once all the nodes
//     that use it have sent their contribution; processing it calls its backward function and
//     decrements the count of each input. A leaf's contribution goes straight into grad(); when
//     its count reaches zero nothing can add to it any more, so its hooks fire right there,
//     before any other node is processed.
// Among ready results, the most recently created goes first (Variable results carry a creation
// sequence number), i.e. the reverse of the forward order, as PyTorch's engine does; so the
// parameters of the last layers finish first and the first layers' last, giving communication
// the most computation to overlap with.

// Note [Thread safety of nn]
// DataParallel runs one module's forward on several threads at once, and users may run backward
// passes on several threads over graphs that share parameters. What makes that safe:
//  - Operations only read their inputs' values and make new nodes; sequence numbers are atomic.
//    The two layers with side effects lock: BatchNorm's running-statistics update
//    (src/nn/batch_norm.cc) and the generator behind initialization and Dropout
//    (src/nn/random.cc).
//  - Each backward() / leaf_gradients() walk keeps its use counts and pending gradients to
//    itself; the only shared state it writes is a leaf's grad(), added to under the leaf's
//    grad_mutex. Hooks run on the thread whose walk completed the leaf, so a leaf shared by
//    concurrent passes may run its hooks concurrently: hooks must then be thread-safe.
// Not safe, and not locked: writing values or grad() (optimizer steps, zero_grad()) while a pass
// over those leaves runs; registering hooks, parameters, buffers or modules, train() and
// manual_seed() concurrently with anything that uses the same objects; reading a grad() while a
// concurrent pass adds to it.

namespace detail {
namespace {

// Results are numbered in creation order; see Note [Hook timing].
std::atomic<std::uint64_t> next_sequence{1};

// Adds `contribution` into `total` in place. Both have the leaf's shape.
void accumulate(Tensor& total, const Tensor& contribution) {
  if (total.shape() != contribution.shape()) {
    throw_invalid_argument("a leaf's grad() has shape ", shape_string(total.shape()),
                           " but its gradient has shape ", shape_string(contribution.shape()),
                           "; grad() must keep the value's shape");
  }
  as_array(total) += as_array(contribution);
}

// Adds `contribution` to the pending gradient of the result `node`. The first one is kept as is;
// later ones are summed into a new tensor, because backward functions may hand out tensors they
// share (an addition passes its output gradient to both inputs), which must not be written.
void add_pending(std::unordered_map<VariableImpl*, Tensor>& pending_grads, VariableImpl* node,
                 Tensor contribution) {
  auto it = pending_grads.find(node);
  if (it == pending_grads.end()) {
    pending_grads.emplace(node, std::move(contribution));
    return;
  }
  Tensor sum = zeros(it->second.shape());
  as_array(sum) = as_array(it->second) + as_array(contribution);
  it->second = std::move(sum);
}

void fire_hooks(const std::shared_ptr<VariableImpl>& leaf) {
  if (leaf->hooks.empty()) return;
  Variable handle = VariableAccess::wrap(leaf);
  // A copy: a hook that registers another hook must not invalidate this loop.
  const std::vector<std::function<void(Variable&)>> hooks = leaf->hooks;
  for (const auto& hook : hooks) hook(handle);
}

// An operation's backward function broke the contract of autograd.h: a bug in src/nn, not in the
// caller's code.
[[noreturn]] void backward_bug(const std::string& what) {
  throw Error(ErrorCode::Internal, "nn: an operation's backward returned a " + what);
}

// Step 1 of Note [Hook timing]: the number of edges into each node reachable from `root`.
std::unordered_map<VariableImpl*, int> count_uses(VariableImpl* root) {
  std::unordered_map<VariableImpl*, int> uses{{root, 0}};
  std::vector<VariableImpl*> to_visit{root};
  while (!to_visit.empty()) {
    VariableImpl* node = to_visit.back();
    to_visit.pop_back();
    for (const std::shared_ptr<VariableImpl>& input : node->inputs) {
      if (!input->requires_grad) continue;
      if (uses[input.get()]++ == 0) to_visit.push_back(input.get());  // First visit.
    }
  }
  return uses;
}

// Where a walk puts a leaf's contribution: into grad(), under the leaf's lock (backward()), or
// into `capture` (leaf_gradients()). See Note [Thread safety of nn].
void deliver(const std::shared_ptr<VariableImpl>& leaf, Tensor contribution,
             LeafGradients* capture) {
  if (capture != nullptr) {
    add_pending(*capture, leaf.get(), std::move(contribution));
    return;
  }
  const tutti::detail::MutexLock lock(leaf->grad_mutex);
  accumulate(leaf->grad, contribution);
}

// Step 2 of Note [Hook timing], from `root` with gradient `seed` (root's shape). Without
// `capture`, leaves accumulate into grad() and fire their hooks; with it, they only fill it.
void run_backward(const std::shared_ptr<VariableImpl>& root, Tensor seed, LeafGradients* capture) {
  if (root->is_leaf()) {
    deliver(root, std::move(seed), capture);
    if (capture == nullptr) fire_hooks(root);
    return;
  }
  std::unordered_map<VariableImpl*, int> uses = count_uses(root.get());
  std::unordered_map<VariableImpl*, Tensor> pending_grads;
  pending_grads.emplace(root.get(), std::move(seed));
  std::priority_queue<std::pair<std::uint64_t, VariableImpl*>> ready;  // Newest first.
  ready.emplace(root->sequence, root.get());
  while (!ready.empty()) {
    VariableImpl* node = ready.top().second;
    ready.pop();
    auto pending = pending_grads.find(node);
    const Tensor grad_output = std::move(pending->second);
    pending_grads.erase(pending);

    Gradients grad_inputs = node->backward(grad_output);
    if (grad_inputs.size() != node->inputs.size()) {
      backward_bug("wrong number of gradients");
    }
    for (std::size_t i = 0; i < node->inputs.size(); ++i) {
      const std::shared_ptr<VariableImpl>& input = node->inputs[i];
      if (!input->requires_grad) continue;
      if (grad_inputs[i].shape() != input->value.shape()) {
        backward_bug("gradient of shape " + shape_string(grad_inputs[i].shape()) +
                     " for an input of shape " + shape_string(input->value.shape()));
      }
      if (input->is_leaf()) {
        deliver(input, std::move(grad_inputs[i]), capture);
      } else {
        add_pending(pending_grads, input.get(), std::move(grad_inputs[i]));
      }
      if (--uses[input.get()] > 0) continue;
      if (input->is_leaf()) {
        if (capture == nullptr) fire_hooks(input);  // Final; see Note [Hook timing].
      } else {
        ready.emplace(input->sequence, input.get());
      }
    }
  }
}

// Note [Backward callbacks]
// DistributedDataParallel must wait for its bucket allreduces and write the averages into grad()
// before backward() returns, and only backward() knows when the last gradient is done. So each
// backward() installs, for its thread, a list that hooks and backward functions append to
// (queue_backward_callback()); once the walk has propagated every gradient, the callbacks run in
// the order queued (ones queued by a callback run too), all of them even if one throws, and the
// first exception is rethrown from backward(). If the walk itself throws, the queued callbacks
// are dropped unrun: their owners must cope with a pass that never finished (DDP does so at its
// next forward). The list is per thread and per call, so a backward() started by a hook (a
// nested pass) has its own, and leaf_gradients() walks, which fire no hooks, have none.

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
  run_backward(root, std::move(seed), nullptr);
  std::exception_ptr first_error;
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
  if (node->requires_grad) run_backward(node, grad_root, &gradients);
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
  detail::VariableImpl& node = detail::checked(impl_);
  if (!node.is_leaf() || !node.requires_grad) {
    detail::throw_invalid_argument(
        "register_grad_hook() needs a leaf Variable that requires grad (a parameter)");
  }
  if (!hook) detail::throw_invalid_argument("register_grad_hook() got an empty hook");
  node.hooks.push_back(std::move(hook));
}

}  // namespace tutti::nn
