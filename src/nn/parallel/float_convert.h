// SPDX-License-Identifier: Apache-2.0
// Element-wise conversion between float32 tensors and their 2-byte copies (float16, bfloat16),
// as DDP's compression and the communication hooks send them. Private to src/nn.
#pragma once

#include <cstring>
#include <span>

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
  const auto copy = [](auto in, auto out) {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = static_cast<float>(in[i]);
  };
  const auto into = [&](auto in) {
    switch (to.dtype()) {
      case DataType::Float32: return copy(in, to.span<float>());
      case DataType::Float16: return copy(in, to.span<float16>());
      case DataType::BFloat16: return copy(in, to.span<bfloat16>());
      default: break;
    }
    throw_invalid_argument(who, ": cannot convert into ", to_string(to.dtype()));
  };
  switch (from.dtype()) {
    case DataType::Float32:
      if (to.dtype() == DataType::Float32) {
        if (to.data() == from.data()) return;
        std::memcpy(to.data(), from.data(), from.byte_size());
        return;
      }
      return into(from.span<float>());
    case DataType::Float16: return into(from.span<float16>());
    case DataType::BFloat16: return into(from.span<bfloat16>());
    default: break;
  }
  throw_invalid_argument(who, ": cannot convert from ", to_string(from.dtype()));
}

}  // namespace tutti::nn::detail
