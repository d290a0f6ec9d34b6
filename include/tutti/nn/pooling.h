// SPDX-License-Identifier: Apache-2.0
// nn::MaxPool2d: 2-d max pooling, as PyTorch's (no padding, output size rounded down).
#pragma once

#include <cstdint>

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/nn/variable.h"

namespace tutti::nn {

// Maximum over kernel_size x kernel_size windows moved by `stride` (0 means kernel_size), no
// padding. The gradient goes to the first maximum of each window. No parameters.
// Throws InvalidArgument for a non-positive kernel size or a negative stride.
class TUTTI_API MaxPool2d : public Module {
 public:
  explicit MaxPool2d(std::int64_t kernel_size, std::int64_t stride = 0);

  // input [n, c, h, w] -> [n, c, (h - kernel_size) / stride + 1, (w - kernel_size) / stride + 1],
  // rounded down. Throws InvalidArgument for another rank or an input smaller than the kernel.
  Variable forward(const Variable& input) override;

 private:
  std::int64_t kernel_size_;
  std::int64_t stride_;
};

}  // namespace tutti::nn
