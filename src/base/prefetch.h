// SPDX-License-Identifier: Apache-2.0
// prefetch_lines(): starts loading an object's cache lines, for loops that look many records up
// and would otherwise wait for each one's cache misses in turn (Note [Lookup pipeline] in
// src/core/negotiation/request_sender.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::base {

inline constexpr std::size_t kCacheLine = 64;

// Starts loading every cache line of the `bytes` bytes at `object`. Never faults, whatever the
// address: a prefetch is a hint.
inline void prefetch_lines(const void* object, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(object) & ~(kCacheLine - 1);
  const auto end = reinterpret_cast<std::uintptr_t>(object) + bytes;
  for (std::uintptr_t line = begin; line < end; line += kCacheLine) {
    __builtin_prefetch(reinterpret_cast<const void*>(line));
  }
}

// The same for the bytes from `begin` up to `end`: from one member of an object to the end of a
// later one.
inline void prefetch_lines(const void* begin, const void* end) {
  prefetch_lines(begin, static_cast<std::size_t>(static_cast<const char*>(end) -
                                                 static_cast<const char*>(begin)));
}

}  // namespace tutti::base
