// SPDX-License-Identifier: Apache-2.0
// The arithmetic of the PowerSGD hooks: see src/nn/parallel/powersgd_math.h.
#include "src/nn/parallel/powersgd_math.h"

#include <cmath>
#include <numbers>
#include <vector>

namespace tutti::nn::detail {
namespace {

// A column whose norm after removing the previous columns' directions is below this fraction of
// its norm before is taken as dependent on them: float32 rounding leaves ~1e-7 relative, and a
// sum over thousands of rows some 100 times that.
constexpr double kDependentColumn = 1e-4;

std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A uniform double in (0, 1]: 53 random bits, never 0 (Box-Muller takes its logarithm).
double uniform(std::uint64_t& x) {
  return (static_cast<double>(splitmix64(x) >> 11) + 1.0) * 0x1.0p-53;
}

}  // namespace

bool should_compress(std::int64_t rows, std::int64_t cols, std::int64_t rank,
                     double min_compression_rate) {
  const double uncompressed = static_cast<double>(rows) * static_cast<double>(cols);
  const double compressed = static_cast<double>(rows + cols) * static_cast<double>(rank);
  return compressed * min_compression_rate < uncompressed;
}

std::int64_t orthogonalize(float* data, std::int64_t rows, std::int64_t cols, double epsilon) {
  const auto at = [&](std::int64_t row, std::int64_t col) -> float& {
    return data[row * cols + col];
  };
  const auto norm_of = [&](std::int64_t col) {
    double squares = 0;
    for (std::int64_t k = 0; k < rows; ++k) squares += static_cast<double>(at(k, col)) * at(k, col);
    return std::sqrt(squares);
  };
  std::vector<double> original(static_cast<std::size_t>(cols));
  for (std::int64_t i = 0; i < cols; ++i) original[static_cast<std::size_t>(i)] = norm_of(i);
  std::int64_t zeroed = 0;
  for (std::int64_t i = 0; i < cols; ++i) {
    const double residual = norm_of(i);
    // A column (numerically) in the span of the previous ones carries no direction of its own:
    // normalizing its rounding noise (what PyTorch does, or NaN for an exact zero) would give
    // a column that is not orthogonal to the others. It is zeroed instead, so the factors
    // still project exactly onto the span (a rank-deficient gradient at full rank stays exact).
    const bool dependent = residual <= kDependentColumn * original[static_cast<std::size_t>(i)];
    const double scale = dependent ? 0.0 : 1.0 / (residual + epsilon);
    for (std::int64_t k = 0; k < rows; ++k) at(k, i) = static_cast<float>(at(k, i) * scale);
    if (dependent) {
      ++zeroed;
      continue;
    }
    for (std::int64_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t k = 0; k < rows; ++k) dot += static_cast<double>(at(k, i)) * at(k, j);
      for (std::int64_t k = 0; k < rows; ++k) {
        at(k, j) = static_cast<float>(at(k, j) - dot * at(k, i));
      }
    }
  }
  return zeroed;
}

void fill_normal(std::span<float> out, std::uint64_t seed, std::uint64_t stream,
                 std::uint64_t draw) {
  std::uint64_t x = seed;
  x = splitmix64(x) ^ stream;
  x = splitmix64(x) ^ draw;
  for (std::size_t i = 0; i < out.size(); i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(uniform(x)));
    const double angle = 2.0 * std::numbers::pi * uniform(x);
    out[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(radius * std::sin(angle));
  }
}

}  // namespace tutti::nn::detail
