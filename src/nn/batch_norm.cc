// SPDX-License-Identifier: Apache-2.0
// BatchNorm1d and BatchNorm2d: one recorded operation over an input viewed as [n, c, inner].
#include "tutti/nn/batch_norm.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "src/nn/autograd.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

using detail::float_data;
using detail::zeros;

namespace {

// torch.nn.BatchNorm*d's defaults.
constexpr double kEps = 1e-5;
constexpr double kMomentum = 0.1;

// Normalizes x [n, c, inner] per channel c. In training mode with the batch statistics (and
// updates the running ones in place), else with the running ones. Backward, with
// xhat = (x - mean) * invstd over the m = n * inner values of a channel:
//   dbias = sum(g), dweight = sum(g * xhat),
//   dx = weight * invstd / m * (m * g - sum(g) - xhat * sum(g * xhat))   (training: mean and
//        var depend on x)
//   dx = weight * invstd * g                                              (evaluation)
Variable batch_norm(const Variable& input, const Variable& weight, const Variable& bias,
                    const Tensor& running_mean, const Tensor& running_var, bool training,
                    std::int64_t n, std::int64_t c, std::int64_t inner) {
  const std::int64_t m = n * inner;
  const float* x = float_data(input.value());
  Tensor y = zeros(input.value().shape());
  Tensor xhat = zeros(input.value().shape());
  Tensor invstd = zeros({c});
  float* r_mean = float_data(running_mean);
  float* r_var = float_data(running_var);
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double mean = r_mean[ch];
    double var = r_var[ch];
    if (training) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < inner; ++j) sum += x[(i * c + ch) * inner + j];
      }
      mean = sum / static_cast<double>(m);
      double squares = 0.0;
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < inner; ++j) {
          const double d = x[(i * c + ch) * inner + j] - mean;
          squares += d * d;
        }
      }
      var = squares / static_cast<double>(m);  // Biased, to normalize; unbiased for the buffer.
      r_mean[ch] = static_cast<float>((1.0 - kMomentum) * r_mean[ch] + kMomentum * mean);
      r_var[ch] = static_cast<float>((1.0 - kMomentum) * r_var[ch] +
                                     kMomentum * squares / static_cast<double>(m - 1));
    }
    const double scale = 1.0 / std::sqrt(var + kEps);
    float_data(invstd)[ch] = static_cast<float>(scale);
    const float gamma = float_data(weight.value())[ch];
    const float beta = float_data(bias.value())[ch];
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < inner; ++j) {
        const std::int64_t at = (i * c + ch) * inner + j;
        const float normalized = static_cast<float>((x[at] - mean) * scale);
        float_data(xhat)[at] = normalized;
        float_data(y)[at] = gamma * normalized + beta;
      }
    }
  }

  auto backward = [xhat, invstd, gamma = weight.value(), training, n, c, inner,
                   x_needs = input.requires_grad()](const Tensor& grad_y) {
    detail::Gradients grads{zeros(xhat.shape()), zeros({c}), zeros({c})};
    const float* g = float_data(grad_y);
    const float* xh = float_data(xhat);
    const double m = static_cast<double>(n * inner);
    for (std::int64_t ch = 0; ch < c; ++ch) {
      double sum_g = 0.0;
      double sum_g_xhat = 0.0;
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < inner; ++j) {
          const std::int64_t at = (i * c + ch) * inner + j;
          sum_g += g[at];
          sum_g_xhat += static_cast<double>(g[at]) * xh[at];
        }
      }
      float_data(grads[1])[ch] = static_cast<float>(sum_g_xhat);
      float_data(grads[2])[ch] = static_cast<float>(sum_g);
      if (!x_needs) continue;
      const double factor = float_data(gamma)[ch] * float_data(invstd)[ch];
      float* dx = float_data(grads[0]);
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < inner; ++j) {
          const std::int64_t at = (i * c + ch) * inner + j;
          const double d =
              training ? factor / m * (m * g[at] - sum_g - xh[at] * sum_g_xhat) : factor * g[at];
          dx[at] = static_cast<float>(d);
        }
      }
    }
    return grads;
  };
  return detail::make_result(std::move(y), {input, weight, bias}, std::move(backward));
}

}  // namespace

BatchNorm1d::BatchNorm1d(std::int64_t features) : features_(features) {
  if (features <= 0) {
    detail::throw_invalid_argument("BatchNorm1d(", features, "): needs a positive feature count");
  }
  weight_ = register_parameter("weight", Variable(zeros({features})));
  detail::as_array(weight_.value()).setOnes();
  bias_ = register_parameter("bias", Variable(zeros({features})));
  running_mean_ = register_buffer("running_mean", Variable(zeros({features})));
  running_var_ = register_buffer("running_var", Variable(zeros({features})));
  detail::as_array(running_var_.value()).setOnes();
}

Variable BatchNorm1d::forward(const Variable& input) {
  const Shape& shape = input.value().shape();
  if ((shape.size() != 2 && shape.size() != 3) || shape[1] != features_) {
    detail::throw_invalid_argument("BatchNorm1d(", features_, ") expects input [n, ", features_,
                                   "] or [n, ", features_, ", l], got ",
                                   detail::shape_string(shape));
  }
  const std::int64_t inner = shape.size() == 3 ? shape[2] : 1;
  if (is_training() && shape[0] * inner <= 1) {
    detail::throw_invalid_argument("BatchNorm1d(", features_,
                                   ") in training mode needs more than "
                                   "one value per channel, got input ",
                                   detail::shape_string(shape));
  }
  return batch_norm(input, weight_, bias_, running_mean_.value(), running_var_.value(),
                    is_training(), shape[0], features_, inner);
}

BatchNorm2d::BatchNorm2d(std::int64_t channels) : channels_(channels) {
  if (channels <= 0) {
    detail::throw_invalid_argument("BatchNorm2d(", channels, "): needs a positive channel count");
  }
  weight_ = register_parameter("weight", Variable(zeros({channels})));
  detail::as_array(weight_.value()).setOnes();
  bias_ = register_parameter("bias", Variable(zeros({channels})));
  running_mean_ = register_buffer("running_mean", Variable(zeros({channels})));
  running_var_ = register_buffer("running_var", Variable(zeros({channels})));
  detail::as_array(running_var_.value()).setOnes();
}

Variable BatchNorm2d::forward(const Variable& input) {
  const Shape& shape = input.value().shape();
  if (shape.size() != 4 || shape[1] != channels_) {
    detail::throw_invalid_argument("BatchNorm2d(", channels_, ") expects input [n, ", channels_,
                                   ", h, w], got ", detail::shape_string(shape));
  }
  const std::int64_t inner = shape[2] * shape[3];
  if (is_training() && shape[0] * inner <= 1) {
    detail::throw_invalid_argument("BatchNorm2d(", channels_,
                                   ") in training mode needs more than "
                                   "one value per channel, got input ",
                                   detail::shape_string(shape));
  }
  return batch_norm(input, weight_, bias_, running_mean_.value(), running_var_.value(),
                    is_training(), shape[0], channels_, inner);
}

}  // namespace tutti::nn
