// SPDX-License-Identifier: Apache-2.0
// The process-wide generator of nn: parameter initialization and dropout masks.
#include "tutti/nn/random.h"

#include <cstdint>
#include <random>

#include "src/nn/random.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {
namespace {

// PyTorch's default CPU seed, so a fresh process starts from the same, documented state.
constexpr std::uint64_t kDefaultSeed = 67280421310721ULL;

// The one generator: API.md asks for a single stream that ranks replay identically. A function
// static, so it is seeded before its first use whatever the static initialization order.
std::mt19937_64& generator() {
  static std::mt19937_64 engine(kDefaultSeed);
  return engine;
}

}  // namespace

void manual_seed(std::uint64_t seed) { generator().seed(seed); }

namespace detail {

double next_unit() {
  // The top 53 bits make every double in [0, 1) with a multiple of 2^-53 equally likely.
  return static_cast<double>(generator()() >> 11) * 0x1.0p-53;
}

void fill_uniform(const Tensor& t, double bound) {
  float* data = float_data(t);
  for (std::int64_t i = 0; i < t.num_elements(); ++i) {
    data[i] = static_cast<float>(-bound + 2.0 * bound * next_unit());
  }
}

}  // namespace detail
}  // namespace tutti::nn
