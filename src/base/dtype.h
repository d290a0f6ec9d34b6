// SPDX-License-Identifier: Apache-2.0
// DataType facts for the per-op paths, inline: the public element_size() and is_floating() are
// calls into the library through its PLT, and an op of P3's 10,000 tiny tensors asked for them
// about ten times on the communication thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "tutti/tensor.h"

namespace tutti::detail {

// element_size(): bytes per element; a value outside the enumeration goes to element_size(),
// which throws InvalidArgument.
inline std::size_t element_bytes(DataType dtype) {
  // In the enumeration's order (tutti/tensor.h).
  constexpr std::array<std::uint8_t, 11> kBytes = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};
  const auto index = static_cast<std::size_t>(dtype);
  return index < kBytes.size() ? kBytes[index] : element_size(dtype);
}

// is_floating(), inline.
inline bool floating(DataType dtype) {
  return dtype == DataType::Float16 || dtype == DataType::BFloat16 || dtype == DataType::Float32 ||
         dtype == DataType::Float64;
}

}  // namespace tutti::detail
