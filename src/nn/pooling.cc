// SPDX-License-Identifier: Apache-2.0
// The MaxPool2d layer: forward records each window's argmax, backward scatters through it.
#include "tutti/nn/pooling.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "src/nn/autograd.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {
namespace {

// The position in `plane` (rows of `width`) of the maximum of the kernel x kernel window whose
// top-left corner is (top, left): the first maximum, or the first NaN, which wins as in PyTorch.
std::int64_t window_argmax(const float* plane, std::int64_t width, std::int64_t top,
                           std::int64_t left, std::int64_t kernel) {
  std::int64_t best_at = top * width + left;
  float best = plane[best_at];
  if (std::isnan(best)) return best_at;
  for (std::int64_t ki = 0; ki < kernel; ++ki) {
    const std::int64_t row = (top + ki) * width + left;
    for (std::int64_t kj = 0; kj < kernel; ++kj) {
      const float v = plane[row + kj];
      if (std::isnan(v)) return row + kj;
      // Conditional moves, not a branch: which element wins is unpredictable.
      const bool greater = v > best;
      best = greater ? v : best;
      best_at = greater ? row + kj : best_at;
    }
  }
  return best_at;
}

}  // namespace

MaxPool2d::MaxPool2d(std::int64_t kernel_size, std::int64_t stride)
    : kernel_size_(kernel_size), stride_(stride == 0 ? kernel_size : stride) {
  if (kernel_size <= 0 || stride < 0) {
    detail::throw_invalid_argument("MaxPool2d(", kernel_size, ", stride ", stride,
                                   "): the kernel size must be positive and the stride "
                                   "non-negative");
  }
}

Variable MaxPool2d::forward(const Variable& input) {
  const Tensor& x = input.value();
  const Shape& shape = x.shape();
  if (shape.size() != 4 || shape[2] < kernel_size_ || shape[3] < kernel_size_) {
    detail::throw_invalid_argument("MaxPool2d(", kernel_size_,
                                   ") expects input [n, c, h, w] with h "
                                   "and w at least the kernel size, got ",
                                   detail::shape_string(shape));
  }
  const std::int64_t planes = shape[0] * shape[1];
  const std::int64_t height = shape[2];
  const std::int64_t width = shape[3];
  const std::int64_t out_height = (height - kernel_size_) / stride_ + 1;
  const std::int64_t out_width = (width - kernel_size_) / stride_ + 1;

  Tensor y = detail::zeros({shape[0], shape[1], out_height, out_width});
  // For each output, the position of its maximum within its input plane (h * w fits int32 for
  // any image that fits memory at float32).
  Tensor argmax(DataType::Int32, y.shape());
  const float* in = detail::float_data(x);
  float* out = detail::float_data(y);
  auto* where = static_cast<std::int32_t*>(argmax.data());
  for (std::int64_t p = 0; p < planes; ++p) {
    const float* plane = in + p * height * width;
    for (std::int64_t oh = 0; oh < out_height; ++oh) {
      for (std::int64_t ow = 0; ow < out_width; ++ow) {
        const std::int64_t at =
            window_argmax(plane, width, oh * stride_, ow * stride_, kernel_size_);
        *out++ = plane[at];
        *where++ = static_cast<std::int32_t>(at);
      }
    }
  }

  auto backward = [argmax, input_shape = shape, planes, plane_size = height * width,
                   outputs_per_plane = out_height * out_width](const Tensor& grad_y) {
    Tensor grad = detail::zeros(input_shape);
    const float* g = detail::float_data(grad_y);
    const auto* from = static_cast<const std::int32_t*>(argmax.data());
    for (std::int64_t p = 0; p < planes; ++p) {
      float* plane = detail::float_data(grad) + p * plane_size;
      for (std::int64_t o = 0; o < outputs_per_plane; ++o) plane[*from++] += *g++;
    }
    return detail::Gradients{std::move(grad)};
  };
  return detail::make_result(std::move(y), {input}, std::move(backward));
}

}  // namespace tutti::nn
