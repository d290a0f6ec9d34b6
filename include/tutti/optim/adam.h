// SPDX-License-Identifier: Apache-2.0
// Adam and AdamW (decoupled weight decay), following torch.optim.Adam and torch.optim.AdamW
// (amsgrad = false) exactly, bias correction included.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tutti/export.h"
#include "tutti/nn/variable.h"
#include "tutti/optim/optimizer.h"
#include "tutti/tensor.h"

namespace tutti::optim {

struct AdamOptions {
  double lr = 0.001;        // Learning rate, >= 0.
  double beta1 = 0.9;       // Decay of the first moment, in [0, 1).
  double beta2 = 0.999;     // Decay of the second moment, in [0, 1).
  double eps = 1e-8;        // Added to the denominator, >= 0.
  double weight_decay = 0;  // L2 penalty added to the gradient (coupled), >= 0.
};

struct AdamWOptions {
  double lr = 0.001;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // Decoupled: p = p · (1 - lr · weight_decay) before the step.
};

// torch.optim.Adam. A step increments the step count t (shared by all parameters: step()
// updates every parameter that requires grad; a step_only() that updates any counts as a step
// for all, where PyTorch counts per parameter) and, for each parameter p it updates, with
// g = p.grad():
//   g = g + weight_decay · p                         (if weight_decay != 0)
//   m = beta1 · m + (1 - beta1) · g                  (m, v start at zero)
//   v = beta2 · v + (1 - beta2) · g²
//   p = p - lr / (1 - beta1^t) · m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Arithmetic is float32 with the bias corrections in double, like PyTorch.
//
// state_dict(): scalars "lr", "beta1", "beta2", "eps", "weight_decay", "step" (t, an integer);
// tensors "<i>.exp_avg" (m) and "<i>.exp_avg_sq" (v), created by the first step.
// Local, not thread-safe (see Optimizer).
class TUTTI_API Adam : public Optimizer {
 public:
  // Throws Error(InvalidArgument) for lr, eps or weight_decay negative, or a beta outside
  // [0, 1) (PyTorch's checks; NaN fails them too).
  explicit Adam(std::vector<nn::Variable> params, AdamOptions options = {});

  void step() override;
  void step_only(const std::vector<bool>& stepped) override;
  StateDict state_dict() const override;
  // Also sets the hyper-parameters and the step count from the scalars it contains; "step"
  // must be a non-negative integer.
  void load_state_dict(const StateDict& state) override;

  // Tutti additions, for learning-rate schedules (see SGD).
  const AdamOptions& options() const { return options_; }
  void set_lr(double lr);

 private:
  AdamOptions options_;
  std::int64_t step_count_ = 0;
  std::vector<std::optional<Tensor>> exp_avg_;     // m, one slot per parameter.
  std::vector<std::optional<Tensor>> exp_avg_sq_;  // v.
};

// torch.optim.AdamW: Adam whose weight decay is decoupled from the gradient. For each
// parameter, first p = p · (1 - lr · weight_decay), then Adam's update above without the L2 term.
// Same state_dict() keys as Adam. Local, not thread-safe.
class TUTTI_API AdamW : public Optimizer {
 public:
  // Throws Error(InvalidArgument) as Adam's constructor.
  explicit AdamW(std::vector<nn::Variable> params, AdamWOptions options = {});

  void step() override;
  void step_only(const std::vector<bool>& stepped) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  const AdamWOptions& options() const { return options_; }
  void set_lr(double lr);

 private:
  AdamWOptions options_;
  std::int64_t step_count_ = 0;
  std::vector<std::optional<Tensor>> exp_avg_;
  std::vector<std::optional<Tensor>> exp_avg_sq_;
};

}  // namespace tutti::optim
