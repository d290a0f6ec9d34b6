// SPDX-License-Identifier: Apache-2.0
// Draws from the process-wide generator of nn (see tutti/nn/random.h). Private to src/nn.
#pragma once

#include "tutti/tensor.h"

namespace tutti::nn::detail {

// A uniform double in [0, 1) from the generator's next 53 bits. Written out rather than using
// std::uniform_real_distribution, whose algorithm the standard leaves to the library, so that
// every build draws the same numbers from the same seed.
double next_unit();

// Fills the float32 tensor `t` with values uniform in [-bound, bound] (float rounding may hit
// the upper end).
void fill_uniform(const Tensor& t, double bound);

}  // namespace tutti::nn::detail
