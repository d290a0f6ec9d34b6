// SPDX-License-Identifier: Apache-2.0
// Small helpers for the optimizer unit tests: parameters from literals, gradients set by hand.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <span>
#include <vector>

#include "tutti/error.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::optim::test {

// A 1-d parameter (requires grad) holding `values`.
inline nn::Variable param(std::initializer_list<float> values) {
  const std::vector<float> v(values);
  return nn::Variable(Tensor::from<float>(v, {static_cast<std::int64_t>(v.size())}), true);
}

inline void set_grad(nn::Variable p, std::initializer_list<float> values) {
  std::span<float> g = p.grad().span<float>();
  std::size_t i = 0;
  for (float v : values) g[i++] = v;
}

inline std::vector<float> values(const nn::Variable& p) {
  const std::span<const float> v = p.value().span<float>();
  return {v.begin(), v.end()};
}

inline std::vector<float> values(const Tensor& t) {
  const std::span<const float> v = t.span<float>();
  return {v.begin(), v.end()};
}

// The code of the tutti::Error thrown by `f`, or Internal if it did not throw one.
template <class F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::Internal;
}

}  // namespace tutti::optim::test
