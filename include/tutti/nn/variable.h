// SPDX-License-Identifier: Apache-2.0
// nn::Variable: a float32 tensor that records the operations applied to it, so that backward()
// can accumulate gradients into the leaves and fire their hooks as soon as each is final.
#pragma once

#include <functional>
#include <memory>

#include "tutti/export.h"
#include "tutti/tensor.h"

namespace tutti::nn {

namespace detail {
struct VariableImpl;
struct VariableAccess;
}  // namespace detail

// A shared handle to a float32 CPU tensor that may carry a gradient. Copies share the value, the
// gradient, the hooks and the recorded history, like torch.Tensor.
//
// A Variable is either a leaf, made by the constructor (inputs, parameters), or the result of a
// differentiable operation (the layers, the losses, functional.h). An operation records how to
// send a gradient back to its inputs only when one of them requires grad; its result then
// requires grad too. Results of operations never accumulate a gradient themselves: only leaves
// do (as in PyTorch without retain_grad()).
//
// Threads: graphs may be built (forward) and differentiated (backward()) on several threads at
// once, also when they share leaves such as parameters: each pass adds into a shared leaf's
// grad() under that leaf's lock. The hooks run on the thread whose backward() completed the
// leaf's gradient, so with concurrent passes over shared leaves they must be thread-safe. Not
// safe: changing a value or grad() (optimizer steps, zero_grad()), or registering hooks, while a
// pass that uses the Variable runs on another thread. See the README's "Threads in nn".
class TUTTI_API Variable {
 public:
  // Empty: the accessors, backward() and register_grad_hook() throw InvalidArgument until a
  // Variable is assigned to it (defined() and is_leaf() say false).
  Variable() = default;
  // A leaf holding `value` (shared with the caller, not copied). With `requires_grad`, grad() is
  // a zero-filled tensor of the same shape. Implicit, so that a Tensor can be passed where a
  // Variable is expected (model.forward(images)).
  // Throws InvalidArgument unless `value` is a float32 CPU tensor with storage (a
  // default-constructed Tensor has none; a zero-element one does).
  Variable(Tensor value, bool requires_grad = false);  // NOLINT(google-explicit-constructor)

  // The value, shared by every copy of this Variable. Operations keep (shared, not copied) the
  // values their backward() needs, so writing into a value between a forward pass and its
  // backward() changes the gradients; update parameters after backward(), as training loops do.
  const Tensor& value() const;
  Tensor& value();
  // The gradient accumulated by backward() calls: for a leaf that requires grad, a tensor of the
  // value's shape, zero until a backward() reaches it. backward() adds to it and never clears it;
  // clear it between steps (Optimizer::zero_grad()). An empty Tensor for Variables that do not
  // require grad and for results of operations.
  const Tensor& grad() const;
  Tensor& grad();
  bool requires_grad() const;
  // Tutti addition (torch.Tensor.requires_grad_()): turns this leaf's gradient off, to freeze a
  // parameter (a pretrained layer), or on again. Off: grad() becomes an empty Tensor and
  // backward() passes leave the leaf out (no gradient, no hooks); on: grad() is a zero-filled
  // tensor, as the constructor makes it. Change it between steps: not between a forward pass and
  // its backward(), and not while backward() runs on another thread. Plain optimizers skip, at
  // each step, the parameters that do not require grad; the data-parallel wrappers
  // (nn::DistributedDataParallel, optim::DistributedOptimizer, optim::ZeroRedundancyOptimizer)
  // fix which parameters they reduce when they are constructed, so freeze before constructing
  // them, as with PyTorch's DDP (one frozen later fails their next backward() or step() with
  // InvalidArgument). Throws InvalidArgument for an empty Variable or the result of an
  // operation.
  void set_requires_grad(bool on);
  // Tutti additions: false for a default-constructed Variable; true for Variables made by the
  // constructor (as opposed to results of operations). Neither throws.
  bool defined() const;
  bool is_leaf() const;

  // Differentiates this Variable, which must hold exactly one element (any shape), with respect
  // to every leaf of its graph that requires grad, adding d(this)/d(leaf) into leaf.grad().
  // The graph is kept: calling backward() again adds the same gradients again.
  // Each leaf's hooks fire once per call, in registration order, as soon as that leaf's gradient
  // is complete (every use of the leaf in the graph has contributed) and while the rest of the
  // graph is still being differentiated; leaves not reached fire nothing. An exception from a
  // hook stops backward() and propagates; gradients already accumulated stay, and the failed-pass
  // hooks of the graph's leaves are called first (register_failed_pass_hook()).
  // Throws InvalidArgument for an empty Variable, one with more than one element, or one that
  // does not require grad (no leaf of its graph requires grad).
  void backward();

  // Adds `hook`, called with this leaf once per backward() pass when its gradient is completely
  // accumulated; it may read and modify grad() (the distributed optimizer starts an allreduce of
  // it there). Hooks stay registered for the Variable's lifetime.
  // Throws InvalidArgument unless this is a leaf that requires grad, or for an empty `hook`.
  void register_grad_hook(std::function<void(Variable&)> hook);

  // Tutti addition: adds `hook`, called with this leaf when a backward() whose graph reaches it
  // throws (from an operation's backward, a hook, or a grad() not of the value's shape), whether
  // or not this leaf's grad hooks ran in that pass (those that did not never will). It runs on
  // the thread of that backward(), after the walk stopped and before backward() rethrows; what
  // it throws is dropped. Meant for code that counts passes or starts work from grad hooks and
  // must learn that a pass ended early: DistributedOptimizer sends the reductions this rank owes
  // with it, so that the other ranks stay on the same step. Hooks stay registered for the
  // Variable's lifetime. Throws InvalidArgument unless this is a leaf that requires grad, or for
  // an empty `hook`.
  void register_failed_pass_hook(std::function<void(Variable&)> hook);

 private:
  friend struct detail::VariableAccess;
  std::shared_ptr<detail::VariableImpl> impl_;
};

}  // namespace tutti::nn
