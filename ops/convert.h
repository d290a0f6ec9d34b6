// SPDX-License-Identifier: Apache-2.0
// Element conversion with scaling, the inner loop of fusion pack and unpack (implemented in
// ops/cpu/convert.cc):
//   destination[i] = DestinationType(source[i] * factor)
// computed in float for Float16/BFloat16/Float32 sources and targets, in double otherwise;
// conversion to an integer type truncates toward zero (API.md's integer Average). With
// factor 1 and equal types it is a memcpy.
#pragma once

#include <cstddef>

#include "tutti/tensor.h"

namespace tutti::ops::cpu {

void convert_scale(void* destination, DataType destination_type, const void* source,
                   DataType source_type, std::size_t count, double factor);

}  // namespace tutti::ops::cpu
