// SPDX-License-Identifier: Apache-2.0
// The seam between nn's autograd engine and distributed autograd (src/dist_autograd): all that
// layer may know of the graph behind nn::Variable. Graph nodes are opaque to it; the rest of
// the engine (src/nn/autograd.h) stays private to src/nn.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::nn::detail {

struct VariableImpl;  // A node of the graph; defined in src/nn/autograd.h.

// The node behind a Variable (null for an empty one), and a Variable handle on a node.
std::shared_ptr<VariableImpl> node_of(const Variable& v);
Variable variable_of(std::shared_ptr<VariableImpl> node);

// A result without inputs whose backward pass ends in `on_gradient`, called with the node's
// complete gradient (every use has contributed) on the thread running the backward pass. It
// requires grad and is not a leaf; distributed autograd makes the tensors an RPC received into
// such nodes (the "recv" end of a send/recv pair).
Variable make_source(Tensor value, std::function<void(const Tensor& gradient)> on_gradient);

// One root of run_backward_into(): a node and the gradient of its value (same shape).
struct RootGradient {
  std::shared_ptr<VariableImpl> node;
  Tensor gradient;
};
// Receives the gradient contributions reaching a leaf in run_backward_into(), possibly several
// per leaf (the sink sums them). `gradient` may be shared with the graph: never write into it.
using LeafSink =
    std::function<void(const std::shared_ptr<VariableImpl>& leaf, const Tensor& gradient)>;

// A backward pass from several roots at once, each seeded with its own gradient, that hands
// leaf gradients to `sink` instead of adding them to grad(), and fires no hooks. Roots may
// share subgraphs or lie on each other's graphs: each node runs once, after all its
// contributions (the ordering of Note [Hook timing] in src/nn/backward_walk.cc). Roots that do
// not require grad are skipped. Any thread; the graph is only read, so passes over one graph
// may run concurrently (backward functions are pure). Throws InvalidArgument for a null root or
// a gradient whose shape differs from its root's value; what a backward function throws
// propagates.
void run_backward_into(const std::vector<RootGradient>& roots, const LeafSink& sink);

}  // namespace tutti::nn::detail
