// SPDX-License-Identifier: Apache-2.0
// Test helpers for nn: tensors with known contents, finite-difference gradient checks (which
// supply expected gradients independently of the backward code under test), small matchers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tutti/nn.h"

namespace tutti::test {

// Overwrites a parameter's values.
inline void set_values(const nn::Variable& v, std::initializer_list<float> new_values) {
  REQUIRE(static_cast<std::int64_t>(new_values.size()) == v.value().num_elements());
  std::copy(new_values.begin(), new_values.end(), v.value().span<float>().begin());
}

// A float32 tensor of `shape` uniform in [low, high), from a generator local to the test so that
// inputs do not depend on nn's generator (which the code under test also draws from).
inline Tensor random_tensor(const Shape& shape, std::uint64_t seed, float low = -1.0f,
                            float high = 1.0f) {
  Tensor t(DataType::Float32, shape);
  std::mt19937_64 engine(seed);
  for (float& v : t.span<float>()) {
    v = low + (high - low) * static_cast<float>(static_cast<double>(engine() >> 11) * 0x1.0p-53);
  }
  return t;
}

// A float32 tensor of `shape` holding a shuffled run of odd multiples of gap / 2 around zero
// (..., -gap / 2, gap / 2, ...): no two elements within `gap` of each other and none within
// gap / 2 of zero, so a finite-difference step below gap / 2 never crosses a kink of max or relu.
inline Tensor distinct_tensor(const Shape& shape, std::uint64_t seed, float gap = 0.05f) {
  Tensor t(DataType::Float32, shape);
  std::span<float> values = t.span<float>();
  std::vector<int> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  const std::size_t middle = values.size() / 2;  // Rounded down, so that k - middle + 0.5 != 0.
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = gap * (static_cast<float>(order[i]) - static_cast<float>(middle) + 0.5f);
  }
  return t;
}

// The elements of a float32 tensor, for comparisons with ==.
inline std::vector<float> values(const Tensor& t) {
  const std::span<float> s = t.span<float>();
  return {s.begin(), s.end()};
}

// Matches a tutti::Error with code InvalidArgument: CHECK_THROWS_MATCHES(f(), Error,
// invalid_argument()).
inline Catch::Matchers::Generic::PredicateMatcher<Error> invalid_argument() {
  return Catch::Predicate<Error>(
      [](const Error& e) { return e.code() == ErrorCode::InvalidArgument; },
      "is an InvalidArgument error");
}

// A float32 tensor from literal values.
inline Tensor tensor(std::initializer_list<float> values, Shape shape) {
  return Tensor::from(std::span<const float>(values.begin(), values.size()), std::move(shape));
}

// sum(y * r) for a fixed random r of y's shape: a scalar whose gradient with respect to y is r,
// so every element of y is checked with a different weight.
inline nn::Variable project(const nn::Variable& y, std::uint64_t seed = 99) {
  return nn::sum(y * nn::Variable(random_tensor(y.value().shape(), seed)));
}

// Sets every leaf's gradient to zero.
inline void zero_grads(std::vector<nn::Variable>& leaves) {
  for (nn::Variable& v : leaves)
    std::fill(v.grad().span<float>().begin(), v.grad().span<float>().end(), 0.0f);
}

// Checks the gradients backward() computes for the scalar `f()` with respect to each leaf in
// `wrt` against central differences (f(v + eps) - f(v - eps)) / (2 eps), element by element,
// within |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|). `f` must rebuild
// its graph from the leaves' current values each time it is called.
inline void check_gradients(const std::function<nn::Variable()>& f, std::vector<nn::Variable> wrt,
                            float eps = 1e-3f, double rtol = 1e-2, double atol = 2e-3) {
  zero_grads(wrt);
  f().backward();
  for (std::size_t k = 0; k < wrt.size(); ++k) {
    std::span<float> value = wrt[k].value().span<float>();
    const std::span<const float> analytic = wrt[k].grad().span<float>();
    int failures = 0;
    std::ostringstream first_failure;
    for (std::size_t i = 0; i < value.size(); ++i) {
      const float saved = value[i];
      value[i] = saved + eps;
      const double plus = f().value().span<float>()[0];
      value[i] = saved - eps;
      const double minus = f().value().span<float>()[0];
      value[i] = saved;
      const double numeric = (plus - minus) / (2.0 * static_cast<double>(eps));
      const double tolerance =
          atol + rtol * std::max<double>(std::abs(numeric), std::abs(analytic[i]));
      if (std::abs(numeric - analytic[i]) > tolerance && failures++ == 0) {
        first_failure << "element " << i << ": analytic " << analytic[i] << ", numeric " << numeric;
      }
    }
    INFO("leaf " << k << " (" << value.size() << " elements): " << failures << " mismatches; first "
                 << first_failure.str());
    CHECK(failures == 0);
  }
}

}  // namespace tutti::test
