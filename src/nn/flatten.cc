// SPDX-License-Identifier: Apache-2.0
// The Flatten layer: [n, ...] -> [n, rest].
#include "tutti/nn/flatten.h"

#include <cstdint>

#include "src/nn/tensor_math.h"
#include "tutti/nn/functional.h"

namespace tutti::nn {

Variable Flatten::forward(const Variable& input) {
  const Shape& shape = input.value().shape();
  if (shape.empty()) {
    detail::throw_invalid_argument("Flatten needs an input [n, ...], got a 0-d one");
  }
  std::int64_t rest = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) rest *= shape[i];
  return reshape(input, {shape[0], rest});
}

}  // namespace tutti::nn
