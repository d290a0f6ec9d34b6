// SPDX-License-Identifier: Apache-2.0
// The graph behind nn::Variable, and make_result(), through which every differentiable operation
// records itself. Private to src/nn.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

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
  std::uint64_t sequence = 0;  // Creation order of results; see Note [Hook timing].
  std::vector<std::shared_ptr<VariableImpl>> inputs;
  BackwardFunction backward;
  std::vector<std::function<void(Variable&)>> hooks;  // Leaves only.

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

}  // namespace tutti::nn::detail
