// SPDX-License-Identifier: Apache-2.0
// The backward walk, once for every kind of pass: Variable::backward() (grad() and hooks),
// leaf_gradients() (a map) and distributed autograd's run_backward_into() (a sink), and the
// source nodes of distributed autograd.
#include <algorithm>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/nn/autograd.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn::detail {

// Note [Hook timing]
// The distributed optimizer starts the allreduce of a parameter's gradient from that parameter's
// hook, so a hook must fire as soon as the gradient is final, not when backward() returns:
// the last layer's gradients then travel while the earlier layers are still being
// differentiated. "Final" means every use of the leaf in the graph has contributed, which matters
// when a weight is shared (used twice, its first contribution is not the whole gradient).
//
// A backward pass therefore works in two steps:
//  1. Count uses. A walk from the roots over the nodes that require grad counts, for every node,
//     the edges into it (a node used twice by one op, as in x * x, counts twice). A root reached
//     from another root counts those edges too, so it runs after them.
//  2. Propagate in topological order (Kahn's algorithm). A result is ready once all the nodes
//     that use it have sent their contribution; processing it calls its backward function and
//     decrements the count of each input. A leaf's contribution is delivered at once; when its
//     count reaches zero nothing can add to it any more, so it is complete right there (where
//     backward() fires its hooks), before any other node is processed.
// Among ready results, the most recently created goes first (Variable results carry a creation
// sequence number), i.e. the reverse of the forward order, as PyTorch's engine does; so the
// parameters of the last layers finish first and the first layers' last, giving communication
// the most computation to overlap with.

void add_contribution(std::unordered_map<VariableImpl*, Tensor>& pending, VariableImpl* node,
                      Tensor contribution) {
  auto it = pending.find(node);
  if (it == pending.end()) {
    pending.emplace(node, std::move(contribution));
    return;
  }
  Tensor sum = zeros(it->second.shape());
  as_array(sum) = as_array(it->second) + as_array(contribution);
  it->second = std::move(sum);
}

namespace {

// An operation's backward function broke the contract of autograd.h: a bug in src/nn, not in the
// caller's code.
[[noreturn]] void backward_bug(const std::string& what) {
  throw Error(ErrorCode::Internal, "nn: an operation's backward returned a " + what);
}

// Step 1 of Note [Hook timing] over the union of the roots' graphs.
std::unordered_map<VariableImpl*, int> count_uses(const std::vector<RootGradient>& roots) {
  std::unordered_map<VariableImpl*, int> uses;
  std::unordered_set<VariableImpl*> visited;
  std::vector<VariableImpl*> to_visit;
  for (const RootGradient& root : roots) {
    if (!root.node->requires_grad) continue;
    uses.try_emplace(root.node.get(), 0);
    if (visited.insert(root.node.get()).second) to_visit.push_back(root.node.get());
  }
  while (!to_visit.empty()) {
    VariableImpl* node = to_visit.back();
    to_visit.pop_back();
    for (const std::shared_ptr<VariableImpl>& input : node->inputs) {
      if (!input->requires_grad) continue;
      ++uses[input.get()];
      if (visited.insert(input.get()).second) to_visit.push_back(input.get());
    }
  }
  return uses;
}

// Note [A walk that throws]
// A backward function, a hook or a leaf's accumulation may throw mid-walk. The walk stops there
// and the exception propagates, but code that started work from hooks (DistributedOptimizer's
// reductions, DDP's pass) would otherwise wait for hooks that never fire, and the other ranks
// with it, and so would a SyncBatchNorm's backward, which reduces across ranks. Code that counts
// passes from hooks (DistributedOptimizer with backward_passes_per_step) must also learn that a
// pass whose hooks all ran failed after them. So, with LeafDelivery::abandoned, the walk first
// reports every leaf of the graph, whether or not its hooks ran, and every result whose backward
// had not begun. backward() calls those nodes' failed-pass hooks
// (Variable::register_failed_pass_hook for leaves; DDP's output and synchronized batch norms for
// results). They are reported newest first, the order in which the walk would have reached them.

// Marks a result in `uses` whose backward began, which report_abandoned() leaves out (if that
// backward throws, the exception is the node's own report).
constexpr int kFinished = -1;

// Note [A walk that throws]: hands every leaf of the roots' graphs, and every result that `uses`
// does not mark kFinished, to `abandoned`, newest first (leaves, numbered 0, last). Walks the
// graph again (from shared pointers, which `uses` lacks), so a walk that does not throw pays
// nothing for this.
void report_abandoned(const std::vector<RootGradient>& roots,
                      const std::unordered_map<VariableImpl*, int>& uses,
                      const LeafDelivery& leaves) {
  std::unordered_set<VariableImpl*> visited;
  std::vector<std::shared_ptr<VariableImpl>> to_visit;
  std::vector<std::shared_ptr<VariableImpl>> abandoned;
  for (const RootGradient& root : roots) {
    if (root.node->requires_grad && visited.insert(root.node.get()).second)
      to_visit.push_back(root.node);
  }
  while (!to_visit.empty()) {
    std::shared_ptr<VariableImpl> node = std::move(to_visit.back());
    to_visit.pop_back();
    for (const std::shared_ptr<VariableImpl>& input : node->inputs) {
      if (input->requires_grad && visited.insert(input.get()).second) to_visit.push_back(input);
    }
    const auto it = uses.find(node.get());
    if (node->is_leaf() || it == uses.end() || it->second != kFinished) {
      abandoned.push_back(std::move(node));
    }
  }
  std::stable_sort(
      abandoned.begin(), abandoned.end(),
      [](const std::shared_ptr<VariableImpl>& a, const std::shared_ptr<VariableImpl>& b) {
        return a->sequence > b->sequence;
      });
  for (const std::shared_ptr<VariableImpl>& node : abandoned) leaves.abandoned(node);
}

// Step 2 of Note [Hook timing], over the counts of step 1; marks results kFinished in `uses`.
void propagate(const std::vector<RootGradient>& roots, std::unordered_map<VariableImpl*, int>& uses,
               const LeafDelivery& leaves) {
  std::unordered_map<VariableImpl*, Tensor> pending_grads;
  std::priority_queue<std::pair<std::uint64_t, VariableImpl*>> ready;  // Newest first.
  const auto arrived = [&](const std::shared_ptr<VariableImpl>& node, Tensor gradient) {
    if (!node->is_leaf()) {
      add_contribution(pending_grads, node.get(), std::move(gradient));
      return;
    }
    leaves.contribute(node, std::move(gradient));
  };
  const auto used = [&](const std::shared_ptr<VariableImpl>& node) {
    if (uses[node.get()] > 0) return;
    if (!node->is_leaf()) {
      ready.emplace(node->sequence, node.get());
      return;
    }
    if (leaves.complete) leaves.complete(node);  // Final; see Note [Hook timing].
  };
  std::unordered_set<VariableImpl*> seeded;
  for (const RootGradient& root : roots) {
    if (!root.node->requires_grad) continue;
    // A root seeded twice becomes ready (or complete) once: at its first seed, or when its uses
    // are done.
    const bool first_seed = seeded.insert(root.node.get()).second;
    arrived(root.node, root.gradient);
    if (first_seed) used(root.node);
  }
  while (!ready.empty()) {
    VariableImpl* node = ready.top().second;
    ready.pop();
    auto pending = pending_grads.find(node);
    const Tensor grad_output = std::move(pending->second);
    pending_grads.erase(pending);

    uses[node] = kFinished;  // Begun: a backward that throws is not reported as abandoned.
    Gradients grad_inputs = node->backward(grad_output);
    if (grad_inputs.size() != node->inputs.size()) backward_bug("wrong number of gradients");
    for (std::size_t i = 0; i < node->inputs.size(); ++i) {
      const std::shared_ptr<VariableImpl>& input = node->inputs[i];
      if (!input->requires_grad) continue;
      if (grad_inputs[i].shape() != input->value.shape()) {
        backward_bug("gradient of shape " + shape_string(grad_inputs[i].shape()) +
                     " for an input of shape " + shape_string(input->value.shape()));
      }
      arrived(input, std::move(grad_inputs[i]));
      --uses[input.get()];
      used(input);
    }
  }
}

}  // namespace

// Steps 1 and 2 of Note [Hook timing], and Note [A walk that throws].
void walk_backward(const std::vector<RootGradient>& roots, const LeafDelivery& leaves) {
  std::unordered_map<VariableImpl*, int> uses = count_uses(roots);
  if (!leaves.abandoned) {
    propagate(roots, uses, leaves);
    return;
  }
  try {
    propagate(roots, uses, leaves);
  } catch (...) {
    report_abandoned(roots, uses, leaves);
    throw;
  }
}

std::shared_ptr<VariableImpl> node_of(const Variable& v) { return VariableAccess::impl(v); }

Variable variable_of(std::shared_ptr<VariableImpl> node) {
  return VariableAccess::wrap(std::move(node));
}

Variable make_source(Tensor value, std::function<void(const Tensor& gradient)> on_gradient) {
  Variable result(std::move(value));
  VariableImpl& node = *VariableAccess::impl(result);
  node.requires_grad = true;
  node.sequence = next_result_sequence();
  node.backward = [on_gradient = std::move(on_gradient)](const Tensor& grad_output) {
    on_gradient(grad_output);
    return Gradients{};
  };
  return result;
}

void run_backward_into(const std::vector<RootGradient>& roots, const LeafSink& sink) {
  for (const RootGradient& root : roots) {
    if (!root.node) throw_invalid_argument("a backward root is an empty Variable");
    if (root.gradient.shape() != root.node->value.shape()) {
      throw_invalid_argument("a backward root of shape ", shape_string(root.node->value.shape()),
                             " got a gradient of shape ", shape_string(root.gradient.shape()));
    }
  }
  walk_backward(roots, {.contribute = [&sink](const std::shared_ptr<VariableImpl>& leaf,
                                              Tensor gradient) { sink(leaf, gradient); },
                        .complete = {},
                        .abandoned = {}});
}

}  // namespace tutti::nn::detail
