// SPDX-License-Identifier: Apache-2.0
// Large byte strings kept for reuse: the buffers the control planes' messages and the RPC
// agent's frames travel in (Note [Byte buffers kept for reuse]). Any thread.
//
// Note [Byte buffers kept for reuse]
// An RPC frame is a std::string: the caller encodes its arguments into one, MPI receives it into
// another on the callee, and the result travels back the same way. glibc maps a block above its
// largest mapping threshold (32 MiB) fresh from the kernel on every allocation and unmaps it when
// it is freed, so each of those buffers faulted its pages in, zero-filled, on every call. On the
// 2-core AMD EPYC VM (family 26) a page fault costs some 15 us, 250 ms for a 64 MiB buffer:
// rpc_sync() echoing a 64 MiB tensor took 2.8-3.5 s, against 34-38 ms for raw MPI's ping-pong of
// the same bytes, and 54-65 ms with the buffers kept (rpc_benchmark --sweep-sizes, three
// alternated pairs of runs; README, "RPC"). Tensors have the host memory cache for that (Note
// [Host memory cache] in src/base/host_memory_cache.h), which strings cannot use (their
// allocator is std::allocator's), so the planes and the agent take their large buffers here and
// give them back once done with them: a ping-pong of frames then cycles through a few buffers
// mapped once. The pool keeps at most kMaxBuffers strings of kMinCachedBytes and up, holding
// together at most as many bytes as the host memory cache may (TUTTI_HOST_MEMORY_CACHE, besides
// the cache's own): none before init(), after shutdown(), or with the cache off.
#pragma once

#include <cstddef>
#include <string>

namespace tutti::detail {

inline constexpr std::size_t kMaxBuffers = 4;

// A string of size `bytes`, its contents unspecified, for a caller that overwrites it whole (or
// hands it to a ByteWriter, which empties it and keeps its room): a kept buffer with room for
// `bytes` and at most a quarter more when there is one, else a new one (zero-filled) with room
// up to the host memory cache's size class of `bytes`, so that frames of nearly the same size
// share buffers.
std::string take_byte_buffer(std::size_t bytes);

// Keeps `buffer` for a later take_byte_buffer() if it is large and no larger than the limit in
// bytes, making room by freeing the oldest kept buffers; else frees it. Never throws.
void give_back_byte_buffer(std::string buffer) noexcept;

// Frees every kept buffer (shutdown()).
void release_byte_buffers() noexcept;

// How many buffers are kept now (tests).
std::size_t kept_byte_buffers();

}  // namespace tutti::detail
