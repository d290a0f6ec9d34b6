// SPDX-License-Identifier: Apache-2.0
// BatchNorm1d and BatchNorm2d, and the batch-normalization operation they share with
// SyncBatchNorm (src/nn/batch_norm_op.h).
#include "tutti/nn/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "src/common/mutex.h"
#include "src/nn/autograd.h"
#include "src/nn/batch_norm_op.h"
#include "src/nn/parallel/sync_batch_norm_op.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

using detail::float_data;
using detail::zeros;

namespace detail {

namespace {

// torch.nn.BatchNorm*d's defaults.
constexpr double kEps = 1e-5;
constexpr double kMomentum = 0.1;

// Serializes running-statistics updates: DataParallel runs a module's forward on several
// threads that share its buffers. One lock for all layers: the update is short. (The buffers are
// tensor data, which TUTTI_GUARDED_BY cannot name.)
tutti::detail::Mutex& running_stats_mutex() {
  static tutti::detail::Mutex mutex;
  return mutex;
}

// Per-channel batch mean and biased variance of x [n, c, inner], and the element count behind
// them: two passes (mean, then centred squares) for accuracy. With `reduce`, each rank's count,
// means and sums of squared deviations are gathered and combined in rank order (Chan et al.'s
// pairwise update, as PyTorch's SyncBatchNorm): sums of x and x^2 reduced together lost the
// variance to cancellation when the mean is large against the spread (4 % off at a mean of
// 1e5 and a spread of 0.01).
struct BatchStatistics {
  std::vector<double> mean, var;
  double count = 0;
};

BatchStatistics batch_statistics(const float* x, std::int64_t n, std::int64_t c, std::int64_t inner,
                                 const StatisticsReducer& reduce) {
  const auto channels = static_cast<std::size_t>(c);
  BatchStatistics stats{std::vector<double>(channels), std::vector<double>(channels),
                        static_cast<double>(n * inner)};
  std::vector<double> squares(channels);  // Sums of squared deviations from the mean.
  for (std::size_t ch = 0; ch < channels && stats.count > 0; ++ch) {
    const auto at = [&](std::int64_t i, std::int64_t j) {
      return x[(i * c + static_cast<std::int64_t>(ch)) * inner + j];
    };
    double sum = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < inner; ++j) sum += at(i, j);
    }
    const double mean = sum / stats.count;
    double m2 = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < inner; ++j) m2 += (at(i, j) - mean) * (at(i, j) - mean);
    }
    stats.mean[ch] = mean;
    squares[ch] = m2;
  }
  if (reduce) {
    std::vector<double> row(2 * channels + 1);  // count, means, squares.
    row[0] = stats.count;
    std::copy(stats.mean.begin(), stats.mean.end(), row.begin() + 1);
    std::copy(squares.begin(), squares.end(), row.begin() + 1 + c);
    const Tensor rows = reduce.gather(row);
    const auto* all = static_cast<const double*>(rows.data());
    const std::int64_t ranks = rows.shape().empty() ? 0 : rows.shape()[0];
    stats.count = 0;
    std::fill(stats.mean.begin(), stats.mean.end(), 0.0);
    std::fill(squares.begin(), squares.end(), 0.0);
    for (std::int64_t r = 0; r < ranks; ++r) {
      const double* other = all + r * static_cast<std::int64_t>(row.size());
      const double count = other[0];
      if (count <= 0) continue;
      const double total = stats.count + count;
      for (std::size_t ch = 0; ch < channels; ++ch) {
        const double delta = other[1 + ch] - stats.mean[ch];
        stats.mean[ch] += delta * count / total;
        squares[ch] += other[1 + channels + ch] + delta * delta * stats.count * count / total;
      }
      stats.count = total;
    }
    if (stats.count <= 1) {
      throw_invalid_argument(
          "SyncBatchNorm in training mode needs more than one value per "
          "channel over all ranks, got ",
          stats.count);
    }
  }
  for (std::size_t ch = 0; ch < channels && stats.count > 0; ++ch) {
    stats.var[ch] = squares[ch] / stats.count;
  }
  return stats;
}

}  // namespace

// Backward, with xhat = (x - mean) * invstd over the m values of a channel (m and the sums over
// every rank's batch with `reduce`):
//   dbias = sum(g), dweight = sum(g * xhat)                               (this rank's own)
//   dx = weight * invstd / m * (m * g - sum(g) - xhat * sum(g * xhat))   (training: mean and
//        var depend on x)
//   dx = weight * invstd * g                                              (evaluation)
Variable batch_norm(const Variable& input, const Variable& weight, const Variable& bias,
                    const Tensor& running_mean, const Tensor& running_var, bool training,
                    std::int64_t n, std::int64_t c, std::int64_t inner,
                    const StatisticsReducer& reduce) {
  const float* x = float_data(input.value());
  Tensor y = zeros(input.value().shape());
  Tensor xhat = zeros(input.value().shape());
  Tensor invstd = zeros({c});
  float* r_mean = float_data(running_mean);
  float* r_var = float_data(running_var);
  BatchStatistics stats;
  if (training) {
    stats = batch_statistics(x, n, c, inner, reduce);
    const tutti::detail::MutexLock lock(running_stats_mutex());
    // An empty batch has no statistics: the buffers stay as they are (as PyTorch's), and the
    // output is empty.
    for (std::int64_t ch = 0; ch < c && stats.count > 0; ++ch) {
      const auto k = static_cast<std::size_t>(ch);
      r_mean[ch] = static_cast<float>((1.0 - kMomentum) * r_mean[ch] + kMomentum * stats.mean[k]);
      // Unbiased for the buffer, biased to normalize (as PyTorch).
      r_var[ch] = static_cast<float>((1.0 - kMomentum) * r_var[ch] +
                                     kMomentum * stats.var[k] * stats.count / (stats.count - 1));
    }
  } else {
    const tutti::detail::MutexLock lock(running_stats_mutex());
    stats.mean.assign(r_mean, r_mean + c);
    stats.var.assign(r_var, r_var + c);
  }
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const auto k = static_cast<std::size_t>(ch);
    const double mean = stats.mean[k];
    const double scale = 1.0 / std::sqrt(stats.var[k] + kEps);
    float_data(invstd)[ch] = static_cast<float>(scale);
    const float gamma = float_data(weight.value())[ch];
    const float beta = float_data(bias.value())[ch];
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < inner; ++j) {
        const std::int64_t at = (i * c + ch) * inner + j;
        const auto normalized = static_cast<float>((x[at] - mean) * scale);
        float_data(xhat)[at] = normalized;
        float_data(y)[at] = gamma * normalized + beta;
      }
    }
  }

  auto backward = [xhat, invstd, gamma = weight.value(), training, n, c, inner, reduce,
                   count = stats.count, x_needs = input.requires_grad()](const Tensor& grad_y) {
    Gradients grads{zeros(xhat.shape()), zeros({c}), zeros({c})};
    const float* g = float_data(grad_y);
    const float* xh = float_data(xhat);
    const auto channels = static_cast<std::size_t>(c);
    std::vector<double> sums(2 * channels, 0.0);  // sum(g) per channel, then sum(g * xhat).
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::size_t ch = 0; ch < channels; ++ch) {
        for (std::int64_t j = 0; j < inner; ++j) {
          const std::int64_t at = (i * c + static_cast<std::int64_t>(ch)) * inner + j;
          sums[ch] += g[at];
          sums[channels + ch] += static_cast<double>(g[at]) * xh[at];
        }
      }
    }
    for (std::size_t ch = 0; ch < channels; ++ch) {
      float_data(grads[1])[ch] = static_cast<float>(sums[channels + ch]);
      float_data(grads[2])[ch] = static_cast<float>(sums[ch]);
    }
    if (!x_needs) return grads;
    // Every rank's gradient sums enter the input gradient (SyncBatchNorm); the weight and bias
    // gradients above stay this rank's own.
    if (training && reduce) reduce.sum(sums);
    const double m = count;
    float* dx = float_data(grads[0]);
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const auto k = static_cast<std::size_t>(ch);
      const double factor = float_data(gamma)[ch] * float_data(invstd)[ch];
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < inner; ++j) {
          const std::int64_t at = (i * c + ch) * inner + j;
          const double d = training
                               ? factor / m * (m * g[at] - sums[k] - xh[at] * sums[channels + k])
                               : factor * g[at];
          dx[at] = static_cast<float>(d);
        }
      }
    }
    return grads;
  };
  Variable result = make_result(std::move(y), {input, weight, bias}, std::move(backward));
  if (training && reduce && input.requires_grad()) {
    VariableAccess::impl(result)->failed_pass_hooks.emplace_back(
        [sum_zeros = reduce.sum_zeros, count = 2 * c](Variable&) { sum_zeros(count); });
  }
  return result;
}

}  // namespace detail

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
  // Converted layers check the count over every rank, in detail::batch_norm(). An empty batch
  // is fine (detail::batch_norm()).
  if (is_training() && !sync_ && shape[0] * inner == 1) {
    detail::throw_invalid_argument("BatchNorm1d(", features_,
                                   ") in training mode needs more than "
                                   "one value per channel, got input ",
                                   detail::shape_string(shape));
  }
  return detail::batch_norm(
      input, weight_, bias_, running_mean_.value(), running_var_.value(), is_training(), shape[0],
      features_, inner,
      sync_ && is_training() ? detail::sync_reducer(*sync_) : detail::StatisticsReducer{});
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
  // Converted layers check the count over every rank, in detail::batch_norm(). An empty batch
  // is fine (detail::batch_norm()).
  if (is_training() && !sync_ && shape[0] * inner == 1) {
    detail::throw_invalid_argument("BatchNorm2d(", channels_,
                                   ") in training mode needs more than "
                                   "one value per channel, got input ",
                                   detail::shape_string(shape));
  }
  return detail::batch_norm(
      input, weight_, bias_, running_mean_.value(), running_var_.value(), is_training(), shape[0],
      channels_, inner,
      sync_ && is_training() ? detail::sync_reducer(*sync_) : detail::StatisticsReducer{});
}

}  // namespace tutti::nn
