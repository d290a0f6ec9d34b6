// SPDX-License-Identifier: Apache-2.0
// CPU tensor storage, with freed large blocks kept for reuse (Note [Host memory cache]). Any
// thread.
//
// Note [Host memory cache]
// A collective that makes its outputs (gather, allgather, alltoall, scatter, reducescatter) gets
// fresh storage for them every time. glibc's malloc maps a large block fresh from the kernel and
// unmaps it again when it is freed, so every page of every output faulted in, zero-filled, on
// each use: with 4 ranks on 2 cores, a gather of ResNet-50's gradients took 45 ms instead of
// 6-7 ms (P11, README), and the reused-memory figure is what malloc gave once it kept its
// freed memory (GLIBC_TUNABLES raising its mmap and trim thresholds), which a library must not
// impose on the whole process. So the storage of blocks of kMinCachedBytes and up goes back to
// a cache when its last tensor lets it go, and the next request of the same size class takes
// it, already mapped: PyTorch's caching allocators do the same for device and pinned memory.
// Sizes are rounded up to classes of an eighth of their power of two, so a block serves
// requests up to 12.5 % smaller than it. The cache holds at most capacity() bytes of freed
// blocks; past that the least recently freed go back to malloc. The runtime sets the capacity
// from TUTTI_HOST_MEMORY_CACHE at init() and to 0 at shutdown(), which frees them all; before
// init() nothing is kept. Under AddressSanitizer a cached block is poisoned, so a use after
// free of a tensor's storage is still reported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

// Defined where AddressSanitizer instruments this code (gcc and clang spell it differently).
#if defined(__SANITIZE_ADDRESS__)
#define TUTTI_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TUTTI_ADDRESS_SANITIZER 1
#endif
#endif

namespace tutti::base {

// Blocks smaller than this are malloc's alone: it reuses them from its heap without asking the
// kernel (128 KiB is glibc's default threshold for mapping a block on its own).
inline constexpr std::size_t kMinCachedBytes = 128 * 1024;

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
