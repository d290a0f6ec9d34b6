// SPDX-License-Identifier: Apache-2.0
// Element conversion with scaling, the inner loop of fusion pack and unpack (implemented in
// ops/cpu/convert.cc):
//   destination[i] = DestinationType(source[i] * factor)
// computed in float for Float16/BFloat16/Float32 sources and targets, in double otherwise;
// conversion to an integer type truncates toward zero (API.md's integer Average). With
// factor 1 and equal types it is a memcpy.
#pragma once

#include <cstddef>
#include <cstring>

#include "src/base/dtype.h"
#include "tutti/tensor.h"

namespace tutti::ops::cpu {

// convert_scale() where the types differ or the factor is not 1: the conversion loops.
void convert_elements(void* destination, DataType destination_type, const void* source,
                      DataType source_type, std::size_t count, double factor);

// Inline for its plain-copy case: fusion calls it once per tensor, and a batch of tiny tensors
// (P3) paid more for the call than for the copy.
inline void convert_scale(void* destination, DataType destination_type, const void* source,
                          DataType source_type, std::size_t count, double factor) {
  if (count == 0) return;
  if (destination_type == source_type && factor == 1.0) {
    if (destination != source)
      std::memcpy(destination, source, count * tutti::detail::element_bytes(source_type));
    return;
  }
  convert_elements(destination, destination_type, source, source_type, count, factor);
}

}  // namespace tutti::ops::cpu
