// SPDX-License-Identifier: Apache-2.0
// ReLU and Dropout layers.
#include "tutti/nn/activations.h"

#include "src/nn/random.h"
#include "src/nn/tensor_math.h"
#include "tutti/nn/functional.h"

namespace tutti::nn {

Variable ReLU::forward(const Variable& input) { return relu(input); }

Dropout::Dropout(double p) : p_(p) {
  if (!(p >= 0.0 && p <= 1.0)) {  // Also rejects NaN.
    detail::throw_invalid_argument("Dropout: p must be in [0, 1], got ", p);
  }
}

Variable Dropout::forward(const Variable& input) {
  if (!is_training() || p_ == 0.0) return input;
  // The mask holds 0 for dropped elements and the scale for kept ones, so that the output and
  // its gradient are both a product with it: the multiplication's backward does the rest.
  const float scale = p_ < 1.0 ? static_cast<float>(1.0 / (1.0 - p_)) : 0.0f;
  Tensor mask = detail::zeros(input.value().shape());
  float* m = detail::float_data(mask);
  for (std::int64_t i = 0; i < mask.num_elements(); ++i) {
    m[i] = detail::next_unit() < p_ ? 0.0f : scale;
  }
  return input * Variable(mask);
}

}  // namespace tutti::nn
