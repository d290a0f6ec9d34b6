// SPDX-License-Identifier: Apache-2.0
// cross_entropy and mse_loss, each one recorded operation with a closed-form gradient.
#include "tutti/nn/losses.h"

#include <cmath>
#include <cstdint>
#include <span>
#include <utility>

#include "src/nn/autograd.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

using detail::as_array;
using detail::as_matrix;
using detail::float_data;
using detail::zeros;

Variable cross_entropy(const Variable& logits, const Tensor& labels) {
  const Tensor& x = logits.value();
  if (x.dim() != 2 || x.shape()[0] == 0 || x.shape()[1] == 0) {
    detail::throw_invalid_argument(
        "cross_entropy expects logits [n, classes] with n and classes "
        "positive, got ",
        detail::shape_string(x.shape()));
  }
  const std::int64_t n = x.shape()[0];
  const std::int64_t classes = x.shape()[1];
  if (labels.dtype() != DataType::Int64 || labels.shape() != Shape{n}) {
    detail::throw_invalid_argument("cross_entropy expects labels int64 [", n, "], got ",
                                   to_string(labels.dtype()), " ",
                                   detail::shape_string(labels.shape()));
  }
  const std::span<const std::int64_t> label = labels.span<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    if (label[i] < 0 || label[i] >= classes) {
      detail::throw_invalid_argument("cross_entropy: label ", label[i], " at position ", i,
                                     " is outside [0, ", classes, ")");
    }
  }

  // Softmax with every row shifted by its maximum, so exp() never overflows; then
  // loss_i = log(sum_j exp(x_ij - max_i)) + max_i - x_i,label.
  const detail::MatrixMap logit_matrix = as_matrix(x, n, classes);
  const auto logit = logit_matrix.array();
  Tensor softmax = zeros({n, classes});
  detail::MatrixMap probability_matrix = as_matrix(softmax, n, classes);
  auto probability = probability_matrix.array();
  const Eigen::ArrayXf row_max = logit.rowwise().maxCoeff();
  probability = (logit.colwise() - row_max).exp();
  const Eigen::ArrayXf row_sum = probability.rowwise().sum();
  probability.colwise() /= row_sum;
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    total += std::log(static_cast<double>(row_sum(i))) + row_max(i) - logit(i, label[i]);
  }
  Tensor loss = zeros({});
  float_data(loss)[0] = static_cast<float>(total / static_cast<double>(n));

  // d loss / d x_ij = (softmax_ij - [j == label_i]) / n.
  auto backward = [softmax, labels, n, classes](const Tensor& g) {
    Tensor grad = softmax.clone();
    const std::span<const std::int64_t> label = labels.span<std::int64_t>();
    auto grad_matrix = as_matrix(grad, n, classes);
    for (std::int64_t i = 0; i < n; ++i) grad_matrix(i, label[i]) -= 1.0f;
    as_array(grad) *= float_data(g)[0] / static_cast<float>(n);
    return detail::Gradients{std::move(grad)};
  };
  return detail::make_result(std::move(loss), {logits}, std::move(backward));
}

Variable mse_loss(const Variable& prediction, const Tensor& target) {
  const Tensor& x = prediction.value();
  if (target.dtype() != DataType::Float32 || target.num_elements() != x.num_elements()) {
    detail::throw_invalid_argument("mse_loss expects a float32 target with ", x.num_elements(),
                                   " elements (prediction ", detail::shape_string(x.shape()),
                                   "), got ", to_string(target.dtype()), " ",
                                   detail::shape_string(target.shape()));
  }
  const std::int64_t count = x.num_elements();
  Tensor difference = zeros(x.shape());
  as_array(difference) = as_array(x) - detail::ArrayMap(float_data(target), count);
  Tensor loss = zeros({});
  float_data(loss)[0] = static_cast<float>(as_array(difference).cast<double>().square().sum() /
                                           static_cast<double>(count));

  // d loss / d x = 2 (x - target) / count.
  auto backward = [difference, count](const Tensor& g) {
    Tensor grad = zeros(difference.shape());
    as_array(grad) = as_array(difference) * (2.0f * float_data(g)[0] / static_cast<float>(count));
    return detail::Gradients{std::move(grad)};
  };
  return detail::make_result(std::move(loss), {prediction}, std::move(backward));
}

}  // namespace tutti::nn
