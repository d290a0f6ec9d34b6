// SPDX-License-Identifier: Apache-2.0
// The process-wide generator behind parameter initialization and dropout masks.
#pragma once

#include <cstdint>

#include "tutti/export.h"

namespace tutti::nn {

// Reseeds the one generator (a std::mt19937_64) that initializes layer parameters and draws
// Dropout masks. At start-up it is seeded with a fixed constant, so processes that build the same
// model in the same order get identical weights even without calling this; after
// manual_seed(s), the same sequence of draws follows on every process. Local (no communication).
// Thread-safe (draws are serialized), but draws from several threads at once (Dropout under
// DataParallel) are shared out in an unspecified order.
TUTTI_API void manual_seed(std::uint64_t seed);

}  // namespace tutti::nn
