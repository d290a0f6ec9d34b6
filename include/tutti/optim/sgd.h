// SPDX-License-Identifier: Apache-2.0
// Stochastic gradient descent with momentum, dampening, weight decay and Nesterov momentum,
// following torch.optim.SGD's update rule exactly.
#pragma once

#include <optional>
#include <vector>

#include "tutti/export.h"
#include "tutti/nn/variable.h"
#include "tutti/optim/optimizer.h"
#include "tutti/tensor.h"

namespace tutti::optim {

struct SGDOptions {
  double lr = 0.01;         // Learning rate, >= 0.
  double momentum = 0;      // >= 0; 0 keeps no buffers.
  double dampening = 0;     // Scales the new gradient's share of the momentum buffer by 1 - d.
  double weight_decay = 0;  // L2 penalty added to the gradient, >= 0.
  bool nesterov = false;    // Needs momentum > 0 and dampening == 0.
};

// torch.optim.SGD. For each parameter p that requires grad, with g = p.grad():
//   g = g + weight_decay · p                         (if weight_decay != 0)
//   if momentum != 0:
//     b = g                                          (first step: the buffer starts as g)
//     b = momentum · b + (1 - dampening) · g         (later steps)
//     g = nesterov ? g + momentum · b : b
//   p = p - lr · g
// Arithmetic is float32, like PyTorch's on float32 tensors.
//
// state_dict(): scalars "lr", "momentum", "dampening", "weight_decay", "nesterov" (0 or 1);
// tensors "<i>.momentum_buffer" for the parameters that have one (none before the first step
// with momentum). Local, not thread-safe (see Optimizer).
class TUTTI_API SGD : public Optimizer {
 public:
  // Throws Error(InvalidArgument) for lr, momentum or weight_decay negative (or NaN), or
  // nesterov without momentum > 0 and dampening == 0 (PyTorch's checks).
  explicit SGD(std::vector<nn::Variable> params, SGDOptions options = {});

  void step() override;
  void step_only(const std::vector<bool>& stepped) override;
  StateDict state_dict() const override;
  // Also sets the hyper-parameters from the scalars it contains, checked as by the constructor.
  void load_state_dict(const StateDict& state) override;

  // Tutti additions, for learning-rate schedules: the current options, and a new learning rate
  // (InvalidArgument if negative). Equivalent to loading a state dict with a new "lr".
  const SGDOptions& options() const { return options_; }
  void set_lr(double lr);

 private:
  // One step over the parameters `stepped` selects (all when null).
  void update(const std::vector<bool>* stepped);

  SGDOptions options_;
  std::vector<std::optional<Tensor>> momentum_buffers_;  // One slot per parameter.
};

}  // namespace tutti::optim
