// SPDX-License-Identifier: Apache-2.0
// Element-wise conversion between float32 tensors and their 2-byte copies (float16, bfloat16),
// as DDP's compression and the communication hooks send them. Private to src/nn.
#pragma once

#include <cstring>
#include <span>
#include <vector>

#include "src/nn/tensor_math.h"
#include "tutti/half.h"
#include "tutti/tensor.h"

namespace tutti::nn::detail {

// Writes `from`'s values into `to`, converting (round to nearest even; see tutti/half.h). Both
// hold the same number of elements, each Float32, Float16 or BFloat16; anything else is
// InvalidArgument naming `who`.
inline void convert_floats(const Tensor& from, const Tensor& to, const char* who) {
  if (from.num_elements() != to.num_elements()) {
    throw_invalid_argument(who, ": cannot convert ", from.num_elements(), " elements into ",
                           to.num_elements());
  }
  if (from.num_elements() == 0) return;
  // The pairs with a 2-byte side take tutti::convert's vectorized loops (Note [Converting arrays
  // of halves] in src/base/half.cc); 2-byte to 2-byte goes through float, as the element-wise
  // conversion would.
  const auto from_floats = [&](std::span<const float> in) {
    switch (to.dtype()) {
      case DataType::Float32:
        if (to.data() != in.data()) std::memcpy(to.data(), in.data(), in.size_bytes());
        return;
      case DataType::Float16: return convert(in, to.span<float16>());
      case DataType::BFloat16: return convert(in, to.span<bfloat16>());
      default: break;
    }
    throw_invalid_argument(who, ": cannot convert into ", to_string(to.dtype()));
  };
  const auto from_halves = [&](auto in) {
    if (to.dtype() == DataType::Float32) return convert(in, to.span<float>());
    std::vector<float> wide(in.size());
    convert(in, std::span<float>(wide));
    from_floats(wide);
  };
  switch (from.dtype()) {
    case DataType::Float32: return from_floats(from.span<const float>());
    case DataType::Float16: return from_halves(from.span<const float16>());
    case DataType::BFloat16: return from_halves(from.span<const bfloat16>());
    default: break;
  }
  throw_invalid_argument(who, ": cannot convert from ", to_string(from.dtype()));
}

}  // namespace tutti::nn::detail
