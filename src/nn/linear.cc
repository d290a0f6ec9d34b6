// SPDX-License-Identifier: Apache-2.0
// The Linear layer: one fused, recorded operation y = x W^T + b over Eigen GEMMs.
#include "tutti/nn/linear.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "src/nn/autograd.h"
#include "src/nn/random.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

using detail::as_matrix;
using detail::as_vector;
using detail::Gradients;
using detail::zeros;

namespace {

// x [rows, in] W^T [in, out] + b, as one operation: cheaper than matmul and a broadcast
// addition, which would also need a transposed copy of W. `bias` may be empty.
Variable linear(const Variable& input, const Variable& weight, const Variable& bias,
                std::int64_t rows, Shape out_shape) {
  const Tensor& x = input.value();
  const Tensor& w = weight.value();
  const std::int64_t out = w.shape()[0];
  const std::int64_t in = w.shape()[1];
  Tensor y = zeros(std::move(out_shape));
  auto y_matrix = as_matrix(y, rows, out);
  y_matrix.noalias() = as_matrix(x, rows, in) * as_matrix(w, out, in).transpose();
  const bool has_bias = bias.defined();
  if (has_bias) y_matrix.rowwise() += as_vector(bias.value()).transpose();

  auto backward = [x, w, rows, in, out, has_bias, x_needs = input.requires_grad(),
                   w_needs = weight.requires_grad()](const Tensor& g) {
    const auto g_matrix = as_matrix(g, rows, out);
    Gradients grads(has_bias ? 3 : 2);
    if (x_needs) {  // dX = G W
      grads[0] = zeros(x.shape());
      as_matrix(grads[0], rows, in).noalias() = g_matrix * as_matrix(w, out, in);
    }
    if (w_needs) {  // dW = G^T X
      grads[1] = zeros({out, in});
      as_matrix(grads[1], out, in).noalias() = g_matrix.transpose() * as_matrix(x, rows, in);
    }
    if (has_bias) {  // db = column sums of G
      grads[2] = zeros({out});
      as_vector(grads[2]) = g_matrix.colwise().sum().transpose();
    }
    return grads;
  };
  std::vector<Variable> inputs{input, weight};
  if (has_bias) inputs.push_back(bias);
  return detail::make_result(std::move(y), inputs, std::move(backward));
}

}  // namespace

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias)
    : in_features_(in_features), out_features_(out_features) {
  if (in_features <= 0 || out_features <= 0) {
    detail::throw_invalid_argument("Linear(", in_features, ", ", out_features,
                                   "): feature counts must be positive");
  }
  // PyTorch's default: Kaiming-uniform with a = sqrt(5) for the weight, which works out to the
  // same bound 1/sqrt(fan_in) as the bias's.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  Tensor w = zeros({out_features, in_features});
  detail::fill_uniform(w, bound);
  weight_ = register_parameter("weight", Variable(w));
  if (bias) {
    Tensor b = zeros({out_features});
    detail::fill_uniform(b, bound);
    bias_ = register_parameter("bias", Variable(b));
  }
}

Variable Linear::forward(const Variable& input) {
  const Shape& shape = input.value().shape();
  if (shape.empty() || shape.back() != in_features_) {
    detail::throw_invalid_argument("Linear(", in_features_, ", ", out_features_,
                                   ") expects input [..., ", in_features_, "], got ",
                                   detail::shape_string(shape));
  }
  Shape out_shape = shape;
  out_shape.back() = out_features_;
  return linear(input, weight_, bias_, input.value().num_elements() / in_features_,
                std::move(out_shape));
}

}  // namespace tutti::nn
