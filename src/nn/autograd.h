// SPDX-License-Identifier: Apache-2.0
// The graph behind nn::Variable, and make_result(), through which every differentiable operation
// records itself. Private to src/nn.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "src/common/mutex.h"
#include "src/nn/autograd_seam.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::nn::detail {

// The gradients of an operation's inputs, one per input and in the same order, each of its
// input's shape. Entries for inputs that do not require grad may be left empty.
using Gradients = std::vector<Tensor>;
// Maps the gradient of an operation's output to its inputs' gradients, from what the forward
// pass captured. Called once per backward() pass. It must not write into `grad_output`, which
// may be shared (an addition hands the same tensor to both inputs); it may return it.
using BackwardFunction = std::function<Gradients(const Tensor& grad_output)>;

// One node of the graph, shared by every Variable handle on it. A leaf has no `backward`; an
// operation's result has one and keeps its inputs (the edges of the graph) alive through
// `inputs`. Nodes point only at their inputs, so graphs are acyclic and freed with their root.
struct VariableImpl {
  Tensor value;
  Tensor grad;  // Leaves that require grad only.
  bool requires_grad = false;
  std::uint64_t sequence = 0;  // Creation order of results: Note [Hook timing] (backward_walk.cc).
  std::vector<std::shared_ptr<VariableImpl>> inputs;
  BackwardFunction backward;
  std::vector<std::function<void(Variable&)>> hooks;  // Leaves only.
  // Called when a backward() over this node throws (for a result, only before its backward
  // began): Variable::register_failed_pass_hook() for leaves; DistributedDataParallel's output
  // (Note [DDP reduction passes]) and synchronized batch norms (src/nn/batch_norm_op.h) for
  // results.
  std::vector<std::function<void(Variable&)>> failed_pass_hooks;
  // Held while backward() adds into `grad`, so that backward passes running on several threads
  // over graphs that share this leaf (DataParallel-style code) do not lose contributions. See
  // Note [Thread safety of nn] in src/nn/variable.cc. `grad` is not TUTTI_GUARDED_BY it:
  // Variable::grad() hands out a reference that callers use between backward passes.
  tutti::detail::Mutex grad_mutex;

  bool is_leaf() const { return !backward; }
};

// The back door from src/nn into Variable's handle.
struct VariableAccess {
  static const std::shared_ptr<VariableImpl>& impl(const Variable& v) { return v.impl_; }
  static Variable wrap(std::shared_ptr<VariableImpl> impl) {
    Variable v;
    v.impl_ = std::move(impl);
    return v;
  }
};

// The result of an operation with value `value` computed from `inputs`. When some input requires
// grad, the result requires grad and records `backward` over `inputs`; otherwise `backward` is
// dropped and the result is a plain leaf, so inference builds no graph.
Variable make_result(Tensor value, const std::vector<Variable>& inputs, BackwardFunction backward);

// Turns requires_grad on for the leaf `v`, with a zero gradient (Module::register_parameter).
// Throws InvalidArgument for an empty Variable or the result of an operation.
void enable_grad(const Variable& v);

// The next creation number of a result (see Note [Hook timing] in src/nn/backward_walk.cc);
// make_result() takes its numbers from the same counter.
std::uint64_t next_result_sequence();

// How a backward walk hands over what reaches the leaves.
struct LeafDelivery {
  // Each contribution to a leaf, as it arrives (a leaf used several times gets several).
  std::function<void(const std::shared_ptr<VariableImpl>& leaf, Tensor contribution)> contribute;
  // The leaf's last contribution has arrived: its gradient is final. May be empty.
  std::function<void(const std::shared_ptr<VariableImpl>& leaf)> complete;
  // The walk threw: called for every leaf of the graph and every result whose backward had not
  // begun, newest first, before the exception propagates. May be empty.
  std::function<void(const std::shared_ptr<VariableImpl>& node)> abandoned;
};

// Adds `contribution` to `pending[node]`. The first one is kept as is; later ones are summed into
// a new tensor, because backward functions may hand out tensors they share (an addition passes
// its output gradient to both inputs), which must not be written.
void add_contribution(std::unordered_map<VariableImpl*, Tensor>& pending, VariableImpl* node,
                      Tensor contribution);

// The one backward walk (Note [Hook timing] in src/nn/backward_walk.cc): from `roots`, each
// seeded with its gradient (checked by the caller), over the nodes that require grad, each node
// run once after all its contributions, the newest ready node first. Backward(), leaf_gradients()
// and run_backward_into() differ only in `leaves`.
void walk_backward(const std::vector<RootGradient>& roots, const LeafDelivery& leaves);

// ---- Engine extensions for the data-parallel modules (src/nn/parallel) ----

// Queues `callback` to run once the backward() running on this thread has propagated every
// gradient (so every leaf's hooks have fired), before backward() returns; see
// Note [Backward callbacks] in src/nn/variable.cc. Meant for hooks and backward functions.
// Returns false, queuing nothing, when no backward() is running on this thread.
bool queue_backward_callback(std::function<void()> callback);

// Gradients of the leaves that require grad, keyed by their node.
using LeafGradients = std::unordered_map<VariableImpl*, Tensor>;

// d(sum(root * grad_root))/d(leaf) for every leaf that requires grad and is reachable from
// `root` (torch.autograd.grad): the same walk as backward(), but the leaves' contributions are
// summed into the returned map instead of grad(), and no hook fires and no callback runs.
// `grad_root` has root's shape. Touches no shared state, so threads may run it at once over
// graphs that share leaves. A leaf root maps to `grad_root`. A root that does not require grad
// gives an empty map.
LeafGradients leaf_gradients(const Variable& root, const Tensor& grad_root);

// The leaves that require grad reachable from `root` (itself included when it is one), each
// once, in the order of a depth-first walk from the root (deterministic for a given graph).
std::vector<std::shared_ptr<VariableImpl>> reachable_leaves(const Variable& root);

}  // namespace tutti::nn::detail
