// SPDX-License-Identifier: Apache-2.0
// The reduction at the heart of the shared-memory collectives: one rank combines a slice of
// every peer's staged data, element by element.
#pragma once

#include <cstddef>
#include <span>

#include "ops/backend.h"
#include "tutti/tensor.h"

namespace tutti::ops::cpu {

// destination[i] = op(sources[0][i], sources[1][i], ...) for i < count. `destination` may be one
// of the sources (then that one is combined first); no other overlap. The order of combination
// depends only on the arguments, so equal calls give equal bits. dtype is any DataType but
// Float16/BFloat16 (core widens those); Bool only with Min/Max. Integer Sum and Product wrap around
// as in MPI.
void reduce(void* destination, std::span<const void* const> sources, std::size_t count,
            DataType dtype, WireOp op);

}  // namespace tutti::ops::cpu
