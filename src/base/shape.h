// SPDX-License-Identifier: Apache-2.0
// Element counts of shapes held in any contiguous storage (core keeps negotiated shapes in
// place, not in a Shape vector).
#pragma once

#include <cstdint>
#include <span>

namespace tutti::detail {

// num_elements() of a shape with a non-positive dim or too many elements: 0 when a dim is 0,
// else throws InvalidArgument.
std::int64_t checked_num_elements(std::span<const std::int64_t> dims);

// As tutti::num_elements(const Shape&): the product of the dims, 0 when one is 0.
// Throws InvalidArgument for a negative dim or a product past int64. Inline: the runtime
// counts elements several times per op.
inline std::int64_t num_elements(std::span<const std::int64_t> dims) {
  std::int64_t product = 1;
  for (std::int64_t d : dims) {
    if (d <= 0 || __builtin_mul_overflow(product, d, &product)) return checked_num_elements(dims);
  }
  return product;
}

}  // namespace tutti::detail
