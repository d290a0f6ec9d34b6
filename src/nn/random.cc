// SPDX-License-Identifier: Apache-2.0
// The process-wide generator of nn: parameter initialization and dropout masks.
#include "tutti/nn/random.h"

#include <cstdint>
#include <mutex>
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

// Guards generator(): DataParallel runs Dropout on several threads at once (see
// Note [Thread safety of nn] in src/nn/variable.cc). Which thread gets which numbers is then
// up to the scheduler; a single thread still replays the same sequence.
std::mutex& generator_mutex() {
  static std::mutex mutex;
  return mutex;
}

// The top 53 bits make every double in [0, 1) with a multiple of 2^-53 equally likely.
double draw_unit_locked() { return static_cast<double>(generator()() >> 11) * 0x1.0p-53; }

}  // namespace

void manual_seed(std::uint64_t seed) {
  const std::lock_guard<std::mutex> lock(generator_mutex());
  generator().seed(seed);
}

namespace detail {

double next_unit() {
  const std::lock_guard<std::mutex> lock(generator_mutex());
  return draw_unit_locked();
}

void fill_uniform(const Tensor& t, double bound) {
  const std::lock_guard<std::mutex> lock(generator_mutex());
  float* data = float_data(t);
  for (std::int64_t i = 0; i < t.num_elements(); ++i) {
    data[i] = static_cast<float>(-bound + 2.0 * bound * draw_unit_locked());
  }
}

}  // namespace detail
}  // namespace tutti::nn
