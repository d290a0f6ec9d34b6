// SPDX-License-Identifier: Apache-2.0
// prefetch_lines(): starts loading an object's cache lines, for loops that look many records up
// and would otherwise wait for each one's cache misses in turn (Note [Lookup pipeline] in
// src/core/negotiation/request_sender.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::base {

inline constexpr std::size_t kCacheLine = 64;

// Note [Prefetches kept]
// A function whose only effect is a prefetch has, to GCC, no effect at all: GCC 12 at -O2 deleted
// a call to one that its early inliner had left as a call (CoordinatorCache::prefetch_insert(),
// whose NameIndex and CacheAdmission prefetches never reached the code of the coordinator's loop:
// no prefetch instruction in its object file, and the admission's loads as slow as without).
// So every helper that prefetches, here and in the tables that offer one, is always inlined: the
// prefetch then lands in the loop that calls it, where nothing removes it.

// Starts loading every cache line of the `bytes` bytes at `object`. Never faults, whatever the
// address: a prefetch is a hint.
[[gnu::always_inline]] inline void prefetch_lines(const void* object, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(object) & ~(kCacheLine - 1);
  const auto end = reinterpret_cast<std::uintptr_t>(object) + bytes;
  for (std::uintptr_t line = begin; line < end; line += kCacheLine) {
    __builtin_prefetch(reinterpret_cast<const void*>(line));
  }
}

// The same for the bytes from `begin` up to `end`: from one member of an object to the end of a
// later one.
[[gnu::always_inline]] inline void prefetch_lines(const void* begin, const void* end) {
  prefetch_lines(begin, static_cast<std::size_t>(static_cast<const char*>(end) -
                                                 static_cast<const char*>(begin)));
}

}  // namespace tutti::base
