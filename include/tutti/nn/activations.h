// SPDX-License-Identifier: Apache-2.0
// Parameter-free element-wise layers: ReLU and Dropout.
#pragma once

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/nn/variable.h"

namespace tutti::nn {

// max(x, 0) element-wise, any shape (see relu() in functional.h).
class TUTTI_API ReLU : public Module {
 public:
  Variable forward(const Variable& input) override;
};

// In training mode, zeroes each element with probability p and scales the kept ones by
// 1 / (1 - p), so the expected value is unchanged; the mask is drawn from the generator
// (random.h), so manual_seed() makes it reproducible. In evaluation mode, and for p = 0, the
// input is returned as is. p = 1 zeroes everything.
// Throws InvalidArgument for p outside [0, 1].
class TUTTI_API Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);

  // Any shape; the output has the input's shape.
  Variable forward(const Variable& input) override;

 private:
  double p_;
};

}  // namespace tutti::nn
