// SPDX-License-Identifier: Apache-2.0
// nn::Conv2d: 2-d convolution (cross-correlation) with stride and zero padding, as PyTorch's.
#pragma once

#include <cstdint>

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/nn/variable.h"

namespace tutti::nn {

// 2-d cross-correlation over square kernels with zero padding, as torch.nn.Conv2d (no dilation
// or groups). Parameters "weight" [out_channels, in_channels, kernel_size, kernel_size] and, with
// `bias`, "bias" [out_channels], both uniform in +-1/sqrt(in_channels * kernel_size^2).
// Throws InvalidArgument for a non-positive channel count, kernel size or stride, or a negative
// padding.
class TUTTI_API Conv2d : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size,
         std::int64_t stride = 1, std::int64_t padding = 0, bool bias = true);

  // input [n, in_channels, h, w] -> [n, out_channels, (h + 2 padding - kernel_size) / stride + 1,
  // (w + 2 padding - kernel_size) / stride + 1], rounded down.
  // Throws InvalidArgument for another rank or channel count, or an input smaller than the
  // kernel even after padding.
  Variable forward(const Variable& input) override;

  // Tutti additions: the registered parameters (shared); bias() is empty without a bias.
  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }

 private:
  std::int64_t in_channels_;
  std::int64_t out_channels_;
  std::int64_t kernel_size_;
  std::int64_t stride_;
  std::int64_t padding_;
  Variable weight_;
  Variable bias_;
};

}  // namespace tutti::nn
