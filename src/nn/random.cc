// SPDX-License-Identifier: Apache-2.0
// The process-wide generator of nn: parameter initialization and dropout masks.
#include "tutti/nn/random.h"

#include <cstdint>
#include <random>

#include "src/common/mutex.h"
#include "src/common/thread_annotations.h"
#include "src/nn/random.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {
namespace {

// PyTorch's default CPU seed, so a fresh process starts from the same, documented state.
constexpr std::uint64_t kDefaultSeed = 67280421310721ULL;

// The one generator: API.md asks for a single stream that ranks replay identically. A function
// static, so it is seeded before its first use whatever the static initialization order.
struct Generator {
  // Guards `engine`: DataParallel runs Dropout on several threads at once (see
  // Note [Thread safety of nn] in src/nn/variable.cc). Which thread gets which numbers is then
  // up to the scheduler; a single thread still replays the same sequence.
  tutti::detail::Mutex mutex;
  std::mt19937_64 engine TUTTI_GUARDED_BY(mutex){kDefaultSeed};
};

Generator& generator() {
  static Generator g;
  return g;
}

// The top 53 bits make every double in [0, 1) with a multiple of 2^-53 equally likely.
double draw_unit_locked(Generator& g) TUTTI_REQUIRES(g.mutex) {
  return static_cast<double>(g.engine() >> 11) * 0x1.0p-53;
}

}  // namespace

void manual_seed(std::uint64_t seed) {
  Generator& g = generator();
  const tutti::detail::MutexLock lock(g.mutex);
  g.engine.seed(seed);
}

namespace detail {

double next_unit() {
  Generator& g = generator();
  const tutti::detail::MutexLock lock(g.mutex);
  return draw_unit_locked(g);
}

void fill_uniform(const Tensor& t, double bound) {
  Generator& g = generator();
  const tutti::detail::MutexLock lock(g.mutex);
  float* data = float_data(t);
  for (std::int64_t i = 0; i < t.num_elements(); ++i) {
    data[i] = static_cast<float>(-bound + 2.0 * bound * draw_unit_locked(g));
  }
}

}  // namespace detail
}  // namespace tutti::nn
