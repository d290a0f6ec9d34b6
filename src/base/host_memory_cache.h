// SPDX-License-Identifier: Apache-2.0
// CPU tensor storage, with freed large blocks kept for reuse (Note [Host memory cache]). Any
// thread.
//
// Note [Host memory cache]
// A collective that makes its outputs (gather, allgather, alltoall, scatter, reducescatter) gets
// fresh storage for them every time, and so do the training layers' activations and gradients.
// glibc's malloc maps a large block fresh from the kernel and unmaps it again when it is freed,
// so every page of such storage faulted in, zero-filled, on each use: with 4 ranks on 2 cores a
// gather of ResNet-50's gradients took 45 ms, and 6-7 ms once the memory was reused (P11,
// README). Telling malloc to keep its freed memory (GLIBC_TUNABLES) does the same for the whole
// process, which a library must not impose. So blocks of kMinCachedBytes and up go back to a
// cache when their last tensor lets them go, and the next request of the same size class takes
// one, already mapped: PyTorch's caching allocators do the same for device and pinned memory.
// Size classes are an eighth of a power of two wide, so a block serves requests of up to an
// eighth less than it. The cache holds at most host_cache_capacity() bytes of freed blocks; past
// that the least recently freed go back to malloc. The runtime sets the capacity from
// TUTTI_HOST_MEMORY_CACHE at init() and to 0 at shutdown(), which frees them all; before init()
// nothing is kept. Under AddressSanitizer a cached block is poisoned, so a use after free of a
// tensor's storage is still reported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "src/base/asan.h"  // TUTTI_ADDRESS_SANITIZER, for this header's users and tests.

namespace tutti::base {

// Blocks smaller than this are malloc's alone: it reuses them from its heap without asking the
// kernel (128 KiB is glibc's default threshold for mapping a block on its own).
inline constexpr std::size_t kMinCachedBytes = 128 * 1024;

// `bytes` (kMinCachedBytes or more) rounded up to a multiple of an eighth of its largest power of
// two: at most 8 classes per doubling, each a multiple of 64 bytes. The cache keeps blocks by it.
std::size_t size_class(std::size_t bytes);

// Storage of at least `bytes` on the CPU, 64-byte aligned, contents unspecified, never null
// (also for 0 bytes). A cached block of the size class when there is one. Throws std::bad_alloc.
std::shared_ptr<void> allocate_host(std::size_t bytes);

// The most bytes of freed blocks the cache keeps. Lowering it frees the excess at once, the
// least recently freed first; 0 frees every cached block and keeps none from then on.
void set_host_cache_capacity(std::size_t bytes);
std::size_t host_cache_capacity();

struct HostCacheStats {
  std::size_t cached_bytes = 0;  // Bytes of freed blocks held now.
  std::uint64_t hits = 0;        // Requests served by a cached block, since the process began.
  std::uint64_t misses = 0;      // Requests of kMinCachedBytes and up that malloc served.
};
HostCacheStats host_cache_stats();

}  // namespace tutti::base
