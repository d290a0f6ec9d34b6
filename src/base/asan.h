// SPDX-License-Identifier: Apache-2.0
// TUTTI_ADDRESS_SANITIZER, and poisoning for memory Tutti keeps for reuse: a block held in a
// cache reads as freed under AddressSanitizer until it is handed out again, so a use after
// free is still reported (the host memory cache, the recycling allocator). Without
// AddressSanitizer both functions do nothing.
#pragma once

#include <cstddef>

// Defined where AddressSanitizer instruments this code (gcc and clang spell it differently).
#if defined(__SANITIZE_ADDRESS__)
#define TUTTI_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TUTTI_ADDRESS_SANITIZER 1
#endif
#endif

#if defined(TUTTI_ADDRESS_SANITIZER)
#include <sanitizer/asan_interface.h>
#endif

namespace tutti::base {

inline void poison_memory(void* block, std::size_t bytes) {
#if defined(TUTTI_ADDRESS_SANITIZER)
  ASAN_POISON_MEMORY_REGION(block, bytes);
#else
  static_cast<void>(block);
  static_cast<void>(bytes);
#endif
}

inline void unpoison_memory(void* block, std::size_t bytes) {
#if defined(TUTTI_ADDRESS_SANITIZER)
  ASAN_UNPOISON_MEMORY_REGION(block, bytes);
#else
  static_cast<void>(block);
  static_cast<void>(bytes);
#endif
}

}  // namespace tutti::base
