// SPDX-License-Identifier: Apache-2.0
// The engine's entry points for distributed autograd (autograd.h): backward passes from several
// seeded roots into a per-call sink, and source nodes. Kept apart from variable.cc's
// Variable::backward(), which they do not change.
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
namespace {

// As variable.cc's add_pending(): the first contribution is kept as is, later ones are summed
// into a new tensor, because contributions may be shared with the graph.
void add_pending(std::unordered_map<VariableImpl*, Tensor>& pending_grads, VariableImpl* node,
                 const Tensor& contribution) {
  auto it = pending_grads.find(node);
  if (it == pending_grads.end()) {
    pending_grads.emplace(node, contribution);
    return;
  }
  Tensor sum = zeros(it->second.shape());
  as_array(sum) = as_array(it->second) + as_array(contribution);
  it->second = std::move(sum);
}

[[noreturn]] void backward_bug(const std::string& what) {
  throw Error(ErrorCode::Internal, "nn: an operation's backward returned a " + what);
}

// Step 1 of Note [Hook timing] over the union of the roots' graphs: the number of edges into
// each node. A root reached from another root counts those edges too, so it runs after them.
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

}  // namespace

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
  std::unordered_map<VariableImpl*, int> uses = count_uses(roots);
  std::unordered_map<VariableImpl*, Tensor> pending_grads;
  std::priority_queue<std::pair<std::uint64_t, VariableImpl*>> ready;  // Newest first.
  for (const RootGradient& root : roots) {
    if (!root.node->requires_grad) continue;
    if (root.node->is_leaf()) {
      sink(root.node, root.gradient);
      continue;
    }
    const bool first_seed = !pending_grads.contains(root.node.get());
    add_pending(pending_grads, root.node.get(), root.gradient);
    if (first_seed && uses[root.node.get()] == 0)
      ready.emplace(root.node->sequence, root.node.get());
  }
  while (!ready.empty()) {
    VariableImpl* node = ready.top().second;
    ready.pop();
    auto pending = pending_grads.find(node);
    const Tensor grad_output = std::move(pending->second);
    pending_grads.erase(pending);

    Gradients grad_inputs = node->backward(grad_output);
    if (grad_inputs.size() != node->inputs.size()) backward_bug("wrong number of gradients");
    for (std::size_t i = 0; i < node->inputs.size(); ++i) {
      const std::shared_ptr<VariableImpl>& input = node->inputs[i];
      if (!input->requires_grad) continue;
      if (grad_inputs[i].shape() != input->value.shape()) {
        backward_bug("gradient of shape " + shape_string(grad_inputs[i].shape()) +
                     " for an input of shape " + shape_string(input->value.shape()));
      }
      if (input->is_leaf()) {
        sink(input, grad_inputs[i]);
      } else {
        add_pending(pending_grads, input.get(), grad_inputs[i]);
      }
      if (--uses[input.get()] == 0 && !input->is_leaf())
        ready.emplace(input->sequence, input.get());
    }
  }
}

}  // namespace tutti::nn::detail
