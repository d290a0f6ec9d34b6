// SPDX-License-Identifier: Apache-2.0
// The Conv2d layer: im2col then one GEMM per image forward; GEMMs then col2im backward.
#include "tutti/nn/conv2d.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "src/nn/autograd.h"
#include "src/nn/random.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

using detail::as_matrix;
using detail::as_vector;
using detail::float_data;
using detail::Gradients;
using detail::zeros;

namespace {

// The sizes of one convolution. A "patch" is the channels x kernel x kernel input values one
// output element reads; the "plane" is the out_height x out_width outputs of one channel.
struct Geometry {
  std::int64_t channels, height, width, kernel, stride, padding, out_height, out_width;

  std::int64_t patch() const { return channels * kernel * kernel; }
  std::int64_t plane() const { return out_height * out_width; }
  std::int64_t image() const { return channels * height * width; }
};

// The outputs [first, last) along one axis whose input position `o * stride + offset` lies in
// [0, size); the others read zero padding. (offset = kernel tap - padding.)
std::pair<std::int64_t, std::int64_t> valid_outputs(std::int64_t offset, std::int64_t size,
                                                    std::int64_t stride, std::int64_t outputs) {
  const std::int64_t first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const std::int64_t last = size - offset <= 0 ? 0 : (size - offset + stride - 1) / stride;
  return {std::min(first, outputs), std::min(std::max(first, last), outputs)};
}

// Unfolds one image [channels, height, width] into `cols` [patch, plane]: row
// (c * kernel + ki) * kernel + kj holds, for every output position, the input the kernel tap
// (ki, kj) of channel c reads there, or 0 in the padding. The convolution is then the GEMM
// weight [out_channels, patch] x cols.
void im2col(const Geometry& g, const float* image, float* cols) {
  for (std::int64_t c = 0; c < g.channels; ++c) {
    for (std::int64_t ki = 0; ki < g.kernel; ++ki) {
      const auto [first_row, last_row] =
          valid_outputs(ki - g.padding, g.height, g.stride, g.out_height);
      for (std::int64_t kj = 0; kj < g.kernel; ++kj) {
        const auto [first_col, last_col] =
            valid_outputs(kj - g.padding, g.width, g.stride, g.out_width);
        float* row = cols + ((c * g.kernel + ki) * g.kernel + kj) * g.plane();
        std::fill(row, row + g.plane(), 0.0f);
        const std::int64_t offset = kj - g.padding;
        for (std::int64_t oh = first_row; oh < last_row; ++oh) {
          const float* src = image + (c * g.height + oh * g.stride + ki - g.padding) * g.width;
          float* dst = row + oh * g.out_width;
          for (std::int64_t ow = first_col; ow < last_col; ++ow) {
            dst[ow] = src[ow * g.stride + offset];
          }
        }
      }
    }
  }
}

// The adjoint of im2col: adds every entry of `cols` [patch, plane] into the input position it was
// read from (several output positions read the same input when kernel > stride).
void col2im(const Geometry& g, const float* cols, float* image) {
  for (std::int64_t c = 0; c < g.channels; ++c) {
    for (std::int64_t ki = 0; ki < g.kernel; ++ki) {
      const auto [first_row, last_row] =
          valid_outputs(ki - g.padding, g.height, g.stride, g.out_height);
      for (std::int64_t kj = 0; kj < g.kernel; ++kj) {
        const auto [first_col, last_col] =
            valid_outputs(kj - g.padding, g.width, g.stride, g.out_width);
        const float* row = cols + ((c * g.kernel + ki) * g.kernel + kj) * g.plane();
        const std::int64_t offset = kj - g.padding;
        for (std::int64_t oh = first_row; oh < last_row; ++oh) {
          float* dst = image + (c * g.height + oh * g.stride + ki - g.padding) * g.width;
          const float* src = row + oh * g.out_width;
          for (std::int64_t ow = first_col; ow < last_col; ++ow) {
            dst[ow * g.stride + offset] += src[ow];
          }
        }
      }
    }
  }
}

// The recorded convolution of x [n, channels, height, width] with weight [out, patch] (+ bias).
// Forward keeps the unfolded input [n, patch, plane] for the weight's gradient rather than
// unfolding it again in backward: memory for time.
Variable conv2d(const Variable& input, const Variable& weight, const Variable& bias,
                const Geometry& g) {
  const Tensor& x = input.value();
  const Tensor& w = weight.value();
  const std::int64_t n = x.shape()[0];
  const std::int64_t out = w.shape()[0];
  const std::int64_t patch = g.patch();
  const std::int64_t plane = g.plane();
  const bool has_bias = bias.defined();

  Tensor cols = zeros({n, patch, plane});
  Tensor y = zeros({n, out, g.out_height, g.out_width});
  const auto w_matrix = as_matrix(w, out, patch);
  for (std::int64_t i = 0; i < n; ++i) {
    float* cols_i = float_data(cols) + i * patch * plane;
    im2col(g, float_data(x) + i * g.image(), cols_i);
    auto y_i = detail::MatrixMap(float_data(y) + i * out * plane, out, plane);
    y_i.noalias() = w_matrix * detail::MatrixMap(cols_i, patch, plane);
    if (has_bias) y_i.colwise() += as_vector(bias.value());
  }

  auto backward = [cols, w, g, n, out, has_bias, x_needs = input.requires_grad(),
                   w_needs = weight.requires_grad()](const Tensor& grad_y) {
    const std::int64_t patch = g.patch();
    const std::int64_t plane = g.plane();
    Gradients grads(has_bias ? 3 : 2);
    if (x_needs) grads[0] = zeros({n, g.channels, g.height, g.width});
    if (w_needs) grads[1] = zeros({out, g.channels, g.kernel, g.kernel});
    if (has_bias) grads[2] = zeros({out});
    std::vector<float> grad_cols(x_needs ? patch * plane : 0);
    const auto w_matrix = as_matrix(w, out, patch);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto g_i = detail::MatrixMap(float_data(grad_y) + i * out * plane, out, plane);
      if (x_needs) {  // dX_i = col2im(W^T G_i)
        detail::MatrixMap(grad_cols.data(), patch, plane).noalias() = w_matrix.transpose() * g_i;
        col2im(g, grad_cols.data(), float_data(grads[0]) + i * g.image());
      }
      if (w_needs) {  // dW += G_i cols_i^T
        const auto cols_i = detail::MatrixMap(float_data(cols) + i * patch * plane, patch, plane);
        as_matrix(grads[1], out, patch).noalias() += g_i * cols_i.transpose();
      }
      if (has_bias) as_vector(grads[2]) += g_i.rowwise().sum();
    }
    return grads;
  };
  std::vector<Variable> inputs{input, weight};
  if (has_bias) inputs.push_back(bias);
  return detail::make_result(std::move(y), inputs, std::move(backward));
}

}  // namespace

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size,
               std::int64_t stride, std::int64_t padding, bool bias)
    : in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_size_(kernel_size),
      stride_(stride),
      padding_(padding) {
  if (in_channels <= 0 || out_channels <= 0 || kernel_size <= 0 || stride <= 0 || padding < 0) {
    detail::throw_invalid_argument("Conv2d(", in_channels, ", ", out_channels, ", ", kernel_size,
                                   ", stride ", stride, ", padding ", padding,
                                   "): channels, kernel size and stride must be positive and "
                                   "padding non-negative");
  }
  // PyTorch's default, as for Linear: uniform in +-1/sqrt(fan_in), fan_in = in * k * k.
  const double bound =
      1.0 / std::sqrt(static_cast<double>(in_channels * kernel_size * kernel_size));
  Tensor w = zeros({out_channels, in_channels, kernel_size, kernel_size});
  detail::fill_uniform(w, bound);
  weight_ = register_parameter("weight", Variable(w));
  if (bias) {
    Tensor b = zeros({out_channels});
    detail::fill_uniform(b, bound);
    bias_ = register_parameter("bias", Variable(b));
  }
}

Variable Conv2d::forward(const Variable& input) {
  const Shape& shape = input.value().shape();
  if (shape.size() != 4 || shape[1] != in_channels_ || shape[2] + 2 * padding_ < kernel_size_ ||
      shape[3] + 2 * padding_ < kernel_size_) {
    detail::throw_invalid_argument(
        "Conv2d(", in_channels_, ", ", out_channels_, ", ", kernel_size_, ", stride ", stride_,
        ", padding ", padding_, ") expects input [n, ", in_channels_,
        ", h, w] with h and w + 2 * padding at least the kernel size, got ",
        detail::shape_string(shape));
  }
  const Geometry g{.channels = in_channels_,
                   .height = shape[2],
                   .width = shape[3],
                   .kernel = kernel_size_,
                   .stride = stride_,
                   .padding = padding_,
                   .out_height = (shape[2] + 2 * padding_ - kernel_size_) / stride_ + 1,
                   .out_width = (shape[3] + 2 * padding_ - kernel_size_) / stride_ + 1};
  return conv2d(input, weight_, bias_, g);
}

}  // namespace tutti::nn
